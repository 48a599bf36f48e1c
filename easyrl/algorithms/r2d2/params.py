"""R2D2's numpy side that `agent.py` needs too: the hyper-parameters, its flow and the sequence
columns.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np

from easyrl.algorithms import dqn
from easyrl.algorithms.contract import Flow
from easyrl.errors import ConfigError

FLOW: Flow = "async_replay"
"""The flow: actors ship sequences, learners sample them asynchronously."""


@dataclass(frozen=True)
class Params(dqn.ApexParams):
    """Hyper-parameters of R2D2 (recurrent Ape-X DQN; the optimizer, target and exploration
    keys: `easyrl.algorithms.dqn.ApexParams`)."""

    ALGORITHM: ClassVar[str] = "r2d2"

    burn_in: int = 20
    """Steps at the start of each sequence that only warm the LSTM state up (no loss)."""
    learn_length: int = 40
    """L: steps of each sequence after the burn-in that the loss is on."""
    period: int = 20
    """A new sequence starts every this many steps (T = burn_in + learn_length: overlapping
    sequences when period < T); in [1, T]."""
    gamma: float = 0.997
    """Discount factor."""
    n_step: int = 5
    """Steps of the n-step returns (cut at the sequence end)."""
    batch_size: int = 32
    """Sequences per learner batch."""
    eta: float = 0.9
    """Sequence priority = eta * max |td| + (1 - eta) * mean |td| over its learning steps."""
    value_rescaling: bool = True
    """Learn h(Q) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + rescale_eps * x (no reward clip)."""
    rescale_eps: float = 1e-3
    """The epsilon of the value rescaling h."""
    # R2D2's own defaults of shared keys.
    lr: float = 1e-4
    """Learning rate."""
    target_update_period: int = 2500
    """Learner updates between target-network syncs."""

    @property
    def sequence_length(self) -> int:
        """T: the steps of one stored sequence, burn-in included."""
        return self.burn_in + self.learn_length

    def checks(self) -> dict[str, tuple[bool, str]]:
        """{field: (holds, valid range)}, written so that NaN fails every check."""
        return {
            "burn_in": (self.burn_in >= 0, ">= 0"),
            "learn_length": (self.learn_length >= 1, ">= 1"),
            "period": (
                1 <= self.period <= self.sequence_length,
                f"in [1, burn_in + learn_length] = [1, {self.sequence_length}]",
            ),
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "n_step": (self.n_step >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "eta": (0.0 <= self.eta <= 1.0, "in [0, 1]"),
            "rescale_eps": (self.rescale_eps > 0.0, "> 0"),
            **super().checks(),
        }


def replay_spec(params: Params, obs_space, action_space, lstm: int = 0) -> dict:
    """Columns of one sequence of T = burn_in + learn_length steps of one env (IMPALA's
    unroll columns without the behaviour logits):

        obs       (T + 1, *obs_shape)  the space's dtype; obs[T] follows the last step
        action    (T,)                 int64
        reward    (T,)                 float32
        discount  (T,)                 float32, gamma * (1 - done_t)
        state     (2 * lstm,)          float32, the core's state (c, h) before step 0
        first     (T + 1,)             float32, 1 where obs[t] starts an episode

    Raises:
        ConfigError: the action space is not Discrete, or `lstm` (`model.lstm`) is 0.
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"r2d2 needs a Discrete action space, got {action_space}")
    if lstm < 1:
        raise ConfigError("model.lstm: r2d2 needs an LSTM core: set its units (e.g. 64)")
    t = params.sequence_length
    return {
        "obs": ((t + 1, *obs_space.shape), np.dtype(obs_space.dtype)),
        "action": ((t,), np.dtype(np.int64)),
        "reward": ((t,), np.dtype(np.float32)),
        "discount": ((t,), np.dtype(np.float32)),
        "state": ((2 * int(lstm),), np.dtype(np.float32)),
        "first": ((t + 1,), np.dtype(np.float32)),
    }
