"""IMPALA's numpy side that `agent.py` needs too: its flow, the agent's settings (`AgentParams`,
shared with A3C), the space checks and the unroll columns.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.errors import ConfigError

if TYPE_CHECKING:
    pass

FLOW: Flow = "async_replay"
"""The flow: actors ship unrolls, learners sample batches of them."""


@dataclass(frozen=True)
class AgentParams:
    """What `agent.IMPALA` needs: the unroll, the V-trace and the loss settings. Built from
    IMPALA's or A3C's `Params` (see `agent_params` and `easyrl.algorithms.a3c.build`)."""

    name: str
    """Algorithm name used in error messages ("impala" or "a3c")."""
    flow: Flow
    """Execution flow the agent serves (the runtime reads `agent.flow`)."""
    unroll_length: int
    """T: env steps per unroll."""
    gamma: float
    """Discount factor."""
    rho_bar: float
    """V-trace importance-weight clip."""
    c_bar: float
    """V-trace trace-coefficient clip."""
    lam: float
    """V-trace lambda."""
    baseline_cost: float
    """Weight of the baseline loss."""
    entropy_cost: float
    """Weight of the entropy bonus."""
    grad_clip: float
    """Global-norm gradient clip (0 disables)."""


def check_spaces(obs_space, action_space, model, algorithm: str = "impala") -> None:
    """Checks that the actor-critic network can handle these spaces.

    Raises:
        ConfigError: the action space is not Discrete, the observation is not a Box, or its
            rank does not fit `model.kind` (mlp: flat [D]; conv: frames [H, W, C]; a custom
            torso is not checked here).
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"{algorithm} needs a Discrete action space, got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"{algorithm} needs a Box observation space, got {obs_space}")
    rank = {"mlp": 1, "conv": 3}.get(model.kind)  # a custom torso takes what it takes
    if rank is not None and len(obs_space.shape) != rank:
        raise ConfigError(
            f"{algorithm} with model.kind {model.kind!r} needs observations of rank {rank}, "
            f"got shape {obs_space.shape}"
        )


def unroll_spec(unroll_length: int, obs_space, action_space, lstm: int = 0) -> dict:
    """Columns of one unroll of T = `unroll_length` steps of one env, as
    {name: (per-item shape, dtype)}:

        obs       (T + 1, *obs_shape)  the space's dtype (uint8 frames stay uint8);
                                       obs[T] is the bootstrap observation x_T
        action    (T,)                 int64
        logits    (T, A)               float32, the behaviour policy mu's logits
        reward    (T,)                 float32
        discount  (T,)                 float32, gamma * (1 - done_t), done = terminated |
                                       truncated (see the module docstring)

    and with an LSTM core of `lstm` > 0 units (`model.lstm`):

        state     (2 * lstm,)          float32, the core's state (c, h) before step 0, as the
                                       actor held it (before the reset of `first[0]`)
        first     (T + 1,)             float32, 1 where obs[t] starts an episode: the state
                                       is reset to zeros before that step
    """
    t = int(unroll_length)
    spec = {
        "obs": ((t + 1, *obs_space.shape), np.dtype(obs_space.dtype)),
        "action": ((t,), np.dtype(np.int64)),
        "logits": ((t, int(action_space.n)), np.dtype(np.float32)),
        "reward": ((t,), np.dtype(np.float32)),
        "discount": ((t,), np.dtype(np.float32)),
    }
    if lstm:
        spec["state"] = ((2 * int(lstm),), np.dtype(np.float32))
        spec["first"] = ((t + 1,), np.dtype(np.float32))
    return spec
