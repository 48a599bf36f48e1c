"""DDPG (Lillicrap et al. 2016) and Ape-X DDPG (Horgan et al. 2018): TD3 with its three tricks
off (one critic, no target policy smoothing, the actor updated on every step).

Only the defaults differ from `easyrl.algorithms.td3`; everything else (agent, losses,
collector, replay columns, optimizer groups) is TD3's:
    y = R + discount * Q'(s', mu'(s'));  critic_loss = mean(w * (Q(s, a) - y)^2)
    actor_loss = -mean(Q(s, mu(s)))
"""

from dataclasses import dataclass
from typing import Literal

from easyrl.algorithms import td3

FLOW = td3.FLOW
"""Execution flow: actors ship transitions, learners sample asynchronously."""
REPLAY_KINDS = td3.REPLAY_KINDS
"""Replay tables DDPG works with; the first is the default."""


@dataclass(frozen=True)
class Params:
    """Hyper-parameters of DDPG: TD3's fields, with twin_q, policy_delay and target_noise
    defaulting to plain DDPG (any of them may be turned back on)."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Length of the n-step return computed on the actor."""
    batch_size: int = 256
    """Transitions per learner batch."""
    actor_lr: float = 1e-3
    """Learning rate of the actor (`actor/` variables)."""
    critic_lr: float = 1e-3
    """Learning rate of the critic (`critic/` variables)."""
    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    """Optimizer the PS shards apply gradients with (both groups)."""
    tau: float = 0.005
    """Polyak rate of the target networks: target = tau * online + (1 - tau) * target."""
    twin_q: bool = False
    """Two critics and a min over them in the target (off: DDPG's single critic)."""
    policy_delay: int = 1
    """The actor gets gradients on every `policy_delay`-th learn call (1: every call)."""
    target_noise: float = 0.0
    """Std of the target policy smoothing noise, normalized action units (0: DDPG, none)."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to +-this, in normalized action units."""
    exploration: Literal["gaussian", "ou"] = "gaussian"
    """Exploration noise of the actors: independent Gaussian or Ornstein-Uhlenbeck."""
    exploration_noise: float = 0.1
    """Std of the exploration noise (OU: of its per-step innovation), normalized units."""
    noise_alpha: float = 0.0
    """Ape-X spread: actor i of N explores with exploration_noise * (1 + noise_alpha) **
    (i / (N - 1))."""
    ou_theta: float = 0.15
    """OU mean reversion per env step: x <- (1 - theta) * x + sigma * N(0, 1)."""
    random_steps: int = 0
    """Env steps (per actor) of uniform random actions before the policy takes over."""
    grad_clip: float = 0.0
    """Global-norm gradient clip, applied to the actor and critic groups separately (0
    disables)."""
    max_staleness: int = 1000
    """PS shards drop gradients computed against a version older than this many updates."""

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


def build(params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False):
    """Builds the TF side (a `td3.agent.TD3` with these params).

    Raises:
        ConfigError: `model.kind` is not "mlp", or the spaces are unsupported.
    """
    return td3.build(params, obs_space, action_space, model, seed, learner, name="ddpg")
