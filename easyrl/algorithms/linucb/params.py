"""LinUCB's numpy side that `agent.py` needs too: the hyper-parameters, its flow, the space checks,
the replay columns and the optimizer.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.errors import ConfigError, check_ranges

FLOW: Flow = "async_replay"
"""The flow: actors ship logged steps, learners turn them into A/b increments."""


@dataclass(frozen=True)
class Params:
    """Hyper-parameters of disjoint LinUCB."""

    alpha: float = 1.0
    """Width of the confidence bonus alpha * sqrt(x^T A_k^-1 x) (0: greedy, no exploration)."""
    ridge: float = 1.0
    """lambda: A_k starts as lambda * I (the ridge regularization of theta_k)."""
    batch_size: int = 32
    """Logged steps per learner batch (one push of A/b increments)."""

    max_staleness: ClassVar[int] = 2**62
    """The PS applies every push however old: increments commute, none is ever stale."""

    def __post_init__(self):
        # Written so that NaN fails every check.
        checks = {
            "alpha": (self.alpha >= 0.0 and bool(np.isfinite(self.alpha)), "finite and >= 0"),
            "ridge": (self.ridge > 0.0 and bool(np.isfinite(self.ridge)), "finite and > 0"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
        }
        check_ranges("linucb", self, checks)


def optimizer(params: Params):
    """Plain SGD with learning rate 1: applying a pushed "gradient" g (the negated increments)
    does x <- x - g, i.e. adds the increments to A and b exactly."""
    from easyrl.algorithms.optimizers import OptimizerSpec

    return OptimizerSpec(kind="sgd", lr=1.0)


def check_spaces(obs_space, action_space) -> None:
    """Raises ConfigError unless the observation is a flat Box (the context) and the action
    space is Discrete (the arms)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"linucb needs a Discrete action space (the arms), got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"linucb needs a flat Box observation (the context), got {obs_space}")


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one logged step, as {name: (per-item shape, dtype)}: the `context` [d]
    (float32), the pulled `arm` (int64) and its `reward` (float32)."""
    check_spaces(obs_space, action_space)
    return {
        "context": (tuple(obs_space.shape), np.dtype(np.float32)),
        "arm": ((), np.dtype(np.int64)),
        "reward": ((), np.dtype(np.float32)),
    }
