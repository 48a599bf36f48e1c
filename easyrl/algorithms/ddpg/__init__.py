"""DDPG (Lillicrap et al. 2016) and Ape-X DDPG (Horgan et al. 2018): TD3 with its three tricks
off (one critic, no target policy smoothing, the actor updated on every step).

Only the defaults differ from `easyrl.algorithms.td3`; everything else (agent, losses,
collector, replay columns, optimizer groups) is TD3's:
    y = R + discount * Q'(s', mu'(s'));  critic_loss = mean(w * (Q(s, a) - y)^2)
    actor_loss = -mean(Q(s, mu(s)))
"""

import dataclasses
from dataclasses import dataclass

from easyrl.algorithms import td3
from easyrl.algorithms.contract import PrioritizedAgent


@dataclass(frozen=True)
class Params(td3.Params):
    """Hyper-parameters of DDPG: TD3's fields (see `td3.Params`), with twin_q, policy_delay
    and target_noise defaulting to plain DDPG (any of them may be turned back on)."""

    twin_q: bool = False
    """Two critics and a min over them in the target (off: DDPG's single critic)."""
    policy_delay: int = 1
    """The actor gets gradients on every `policy_delay`-th learn call (1: every call)."""
    target_noise: float = 0.0
    """Std of the target policy smoothing noise, normalized action units (0: DDPG, none)."""

    def __post_init__(self):
        td3.check_params("ddpg", self)


def optimizer(params: Params) -> dict:
    """The PS optimizer groups: `actor/` at `actor_lr`, `critic/` at `critic_lr` (TD3's)."""
    return td3.optimizer(params)


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one n-step transition (TD3's: the action normalized to [-1, 1]).

    Raises:
        ConfigError: unsupported spaces.
    """
    return td3.replay_spec(params, obs_space, action_space, name="ddpg")


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side (a `td3.agent.TD3` with these params).

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, or the spaces are unsupported.
    """
    return td3.build(params, obs_space, action_space, model, seed, learner, name="ddpg")


SPEC = dataclasses.replace(
    td3.SPEC, params_class=Params, build=build, optimizer=optimizer, replay_spec=replay_spec
)
"""DDPG, as the runtime knows it: TD3's spec with DDPG's `Params` (and its name in errors)."""
