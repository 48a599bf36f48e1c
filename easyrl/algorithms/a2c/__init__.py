"""A2C (Mnih et al. 2016, the synchronous variant of A3C): advantage actor-critic in rounds.

Flow "sync_rounds": each round the actors collect `rollout_length` steps per env with the
weights of that round; the one learner takes a single gradient step on the whole round and
publishes the next. The agent is `easyrl.algorithms.ppo.agent.PPO` run for one epoch of one
minibatch: that gradient is taken at the very weights the actors acted with, so the
probability ratio is 1 and the clipped surrogate's gradient is the policy gradient itself,
    loss = -mean(A_t * log pi(a_t|s_t)) + vf_coef * 0.5 * mean((V(s_t) - Vt_t)^2)
           - ent_coef * entropy,
with A_t the GAE(lam) advantage computed on the actor (lam = 1: the bootstrapped n-step
return minus V(s_t), the paper's estimator; episode ends handled as in PPO) and
Vt_t = A_t + V(s_t).

`easyrl.algorithms.pg` (REINFORCE with a baseline) is the same agent with lam fixed at 1;
this module holds what both share.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from easyrl.algorithms import ppo
from easyrl.algorithms.contract import AlgorithmSpec, RoundsAgent
from easyrl.algorithms.learning_rate import LearningRate, lr_checks, schedule_keys
from easyrl.algorithms.registry import check_model_kind
from easyrl.errors import check_ranges


@dataclass(frozen=True)
class OneStepParams(LearningRate):
    """The hyper-parameters A2C and PG share (one gradient step per synchronous round); their
    `Params` add or re-default keys."""

    ALGORITHM: ClassVar[str] = "a2c"

    gamma: float = 0.99
    """Discount factor."""
    rollout_length: int = 5
    """n: vector steps each actor collects per round (one gradient step per round)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    normalize_advantages: bool = False
    """Normalize the round's advantages: (A - mean) / (std + 1e-8)."""
    lr: float = 7e-4
    """Learning rate."""
    grad_clip: float = 0.5
    """Global-norm gradient clip (0 disables)."""
    max_staleness: int = 1_000_000
    """PS shards drop gradients older than this many updates (rounds are synchronous, so
    effectively off)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions only)."""
    normalize_observations: bool = False
    """Feed the networks (obs - mean) / std, clipped to +-obs_clip, with running statistics
    kept on the PS (as PPO's)."""
    obs_clip: float = 10.0
    """Clip of the normalized observations."""

    def __post_init__(self):
        # (holds, valid range); written so that NaN fails every check.
        check_ranges(self.ALGORITHM, self, self.checks())

    def checks(self) -> dict[str, tuple[bool, str]]:
        """Range checks of the keys, for `check_ranges`."""
        return shared_checks(self)

    def ppo_params(self) -> ppo.Params:
        """These settings as PPO's: GAE with lam = 1, one epoch of one minibatch."""
        return one_step_ppo_params(self, lam=1.0)


@dataclass(frozen=True)
class Params(OneStepParams):
    """Hyper-parameters of A2C (one advantage actor-critic step per synchronous round)."""

    lam: float = 1.0
    """GAE lambda of the advantages (1: n-step bootstrapped returns minus the value)."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        """Range checks of the keys, for `check_ranges`."""
        return {**shared_checks(self), "lam": (0.0 <= self.lam <= 1.0, "in [0, 1]")}

    def ppo_params(self) -> ppo.Params:
        """These settings as PPO's: one epoch of one minibatch (the whole round)."""
        return one_step_ppo_params(self, lam=self.lam)


def shared_checks(params: OneStepParams) -> dict[str, tuple[bool, str]]:
    """Range checks of the keys A2C and PG share, for `check_ranges`."""
    return {
        "gamma": (0.0 <= params.gamma <= 1.0, "in [0, 1]"),
        "rollout_length": (params.rollout_length >= 1, ">= 1"),
        "vf_coef": (params.vf_coef >= 0.0, ">= 0"),
        "ent_coef": (params.ent_coef >= 0.0, ">= 0"),
        **lr_checks(params),
        "grad_clip": (params.grad_clip >= 0.0, ">= 0"),
        "max_staleness": (params.max_staleness >= 0, ">= 0"),
        "log_std_init": (bool(np.isfinite(params.log_std_init)), "finite"),
        "obs_clip": (params.obs_clip > 0.0, "> 0"),
    }


def one_step_ppo_params(params, lam: float) -> ppo.Params:
    """PPO's settings for one gradient step per round on the whole round: one epoch, one
    minibatch, no value clipping, no KL early stop (the ratio is 1 at that step, so the
    surrogate's clip never acts)."""
    return ppo.Params(
        gamma=params.gamma,
        lam=lam,
        rollout_length=params.rollout_length,
        num_epochs=1,
        minibatch_size=2**62,  # ceil(n / size) = 1: the whole round
        value_clip=0.0,
        vf_coef=params.vf_coef,
        ent_coef=params.ent_coef,
        normalize_advantages=params.normalize_advantages,
        kl_target=0.0,
        **schedule_keys(params),
        grad_clip=params.grad_clip,
        max_staleness=params.max_staleness,
        log_std_init=params.log_std_init,
        normalize_observations=params.normalize_observations,
        obs_clip=params.obs_clip,
    )


def optimizer(params):
    """The optimizer the PS shards apply the gradients with (`optimizer`, `lr` and its
    schedule)."""
    return ppo.optimizer(params.ppo_params())


def round_share(params, num_envs: int, actor_index: int, num_actors: int) -> int:
    """Items one actor ships per round: `rollout_length * num_envs` env steps."""
    return ppo.round_share(params.ppo_params(), num_envs, actor_index, num_actors)


def replay_spec(params, obs_space, action_space) -> dict:
    """Columns of one env step of a round: PPO's (see `ppo.replay_spec`).

    Raises:
        ConfigError: unsupported spaces.
    """
    ppo.check_spaces(obs_space, action_space, params.ALGORITHM)
    return ppo.replay_spec(params.ppo_params(), obs_space, action_space)


def build(
    params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> RoundsAgent:
    """Builds the TF side: PPO's agent with `params.ppo_params()` (imports TensorFlow).

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, or the spaces are unsupported.
    """
    check_model_kind(params.ALGORITHM, model, SPEC.model_kinds)
    ppo.check_spaces(obs_space, action_space, params.ALGORITHM)
    return ppo.build(params.ppo_params(), obs_space, action_space, model, seed, learner)


SPEC = AlgorithmSpec(
    flow="sync_rounds",  # actors collect a round under one weight round; one learner steps
    replay_kinds=("aggregate",),  # whole rounds of steps
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    round_share=round_share,
    model_kinds=ppo.SPEC.model_kinds,  # PPO's agent, so its networks and action masks
    action_masks=ppo.SPEC.action_masks,
)
"""A2C, as the runtime knows it (PG's too, with its own `Params`)."""
