"""Vanilla policy gradient: REINFORCE with a learned baseline (Williams 1992; Sutton et al.
2000), one step per synchronous round.

Flow "sync_rounds", like A2C (`easyrl.algorithms.a2c`, whose agent and plumbing it uses):
each round the actors collect `rollout_length` steps per env with that round's weights and
the learner takes one gradient step on the whole round,
    loss = -mean(A_t * log pi(a_t|s_t)) + vf_coef * 0.5 * mean((V(s_t) - G_t)^2)
           - ent_coef * entropy,   A_t = G_t - V(s_t),
with G_t the discounted return from t to the episode's end; an episode still running when
the round ends is completed by the bootstrap V(s_T), as Spinning Up's VPG does (that is GAE
with lam = 1). The advantages are normalized per round by default.
"""

from dataclasses import dataclass
from typing import ClassVar, Literal

from easyrl.algorithms import a2c, ppo
from easyrl.algorithms.a2c import (
    FLOW,
    MODEL_KINDS,
    REPLAY_KINDS,
    build,
    optimizer,
    replay_spec,
    round_share,
)
from easyrl.errors import check_ranges

__all__ = [
    "FLOW",
    "MODEL_KINDS",
    "REPLAY_KINDS",
    "Params",
    "build",
    "optimizer",
    "replay_spec",
    "round_share",
]


@dataclass(frozen=True)
class Params:
    """Hyper-parameters of vanilla policy gradient (REINFORCE with a value baseline)."""

    ALGORITHM: ClassVar[str] = "pg"

    gamma: float = 0.99
    """Discount factor of the returns G_t."""
    rollout_length: int = 200
    """Vector steps each actor collects per round (one gradient step per round)."""
    vf_coef: float = 0.5
    """Weight of the baseline's squared error."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Normalize the round's advantages: (A - mean) / (std + 1e-8)."""
    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    """Optimizer the PS shards apply gradients with."""
    lr: float = 1e-3
    """Learning rate."""
    lr_decay_rate: float = 1.0
    """Multiply the learning rate by this every `lr_decay_steps` updates (1.0: constant)."""
    lr_decay_steps: int = 1000
    """Updates between learning-rate decays."""
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
        check_ranges(self.ALGORITHM, self, a2c.shared_checks(self))

    def ppo_params(self) -> ppo.Params:
        """These settings as PPO's: GAE with lam = 1, one epoch of one minibatch."""
        return a2c.one_step_ppo_params(self, lam=1.0)
