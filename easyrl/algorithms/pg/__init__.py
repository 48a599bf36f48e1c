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

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from easyrl.algorithms import a2c
from easyrl.algorithms.a2c import build, optimizer, replay_spec, round_share

__all__ = [
    "SPEC",
    "Params",
    "build",
    "optimizer",
    "replay_spec",
    "round_share",
]


@dataclass(frozen=True)
class Params(a2c.OneStepParams):
    """Hyper-parameters of vanilla policy gradient (REINFORCE with a value baseline); GAE's
    lambda is fixed at 1 (whole-episode returns)."""

    ALGORITHM: ClassVar[str] = "pg"

    # PG's own defaults (the other keys: a2c.OneStepParams).
    rollout_length: int = 200
    """Vector steps each actor collects per round (one gradient step per round)."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Normalize the round's advantages: (A - mean) / (std + 1e-8)."""
    lr: float = 1e-3
    """Learning rate."""


SPEC = dataclasses.replace(a2c.SPEC, params_class=Params)
"""PG, as the runtime knows it: A2C's spec with PG's `Params`."""
