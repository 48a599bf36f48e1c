"""R2D2 (Kapturowski et al. 2019): recurrent Ape-X DQN on sequences with stored states.

Actors act epsilon-greedily (Ape-X's per-actor rates) with an LSTM Q network, carry its state
per env (zeros at an episode start) and ship overlapping sequences of T = `burn_in` +
`learn_length` steps of one env, a new one every `period` steps, each with the state the actor
held before its first step. The prioritized (or uniform) memory shards store and sample them
like any item. Learners unroll the online and target networks from the stored state: the first
`burn_in` steps only warm the state up (no gradient), the loss is on the `learn_length` steps
after them.

Targets (double Q, n-step within the sequence, value rescaling h), for a learning step t of the
sequence, with m = min(n, L - t) steps left to the sequence end L:
    a*_j = argmax_a Q(x_j, a)                                 (online network)
    G_t  = sum_{k<m} (prod_{i<k} discount_{t+i}) r_{t+k}
           + (prod_{i<m} discount_{t+i}) h^-1(Q_target(x_{t+m}, a*_{t+m}))
    td_t = h(G_t) - Q(x_t, a_t);   loss = mean_b(w_b * mean_t(0.5 td_t^2))
    priority_b = eta * max_t |td_t| + (1 - eta) * mean_t |td_t|
    h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x                (identity without rescaling)
Episode ends: discount_t = gamma * (1 - done_t), done = terminated | truncated (as IMPALA:
nothing is bootstrapped across an episode end inside a sequence). This module holds the
hyper-parameters and the numpy side; `agent.R2D2` the TensorFlow side.
"""

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np

from easyrl.algorithms import dqn
from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.errors import ConfigError


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


optimizer = dqn.optimizer
"""The PS optimizer: DQN's (`optimizer`, `lr` and its schedule)."""


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


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of R2D2 (imports TensorFlow; see `agent.R2D2`); every role builds
    the same networks, whatever `learner` says.

    Raises:
        ConfigError: unsupported spaces, or no `model.lstm`.
    """
    from easyrl.algorithms.r2d2.agent import R2D2

    return R2D2(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow="async_replay",  # actors ship sequences, learners sample them asynchronously
    replay_kinds=("prioritized", "uniform"),
    params_class=Params,
    build=build,
    optimizer=dqn.optimizer,
    replay_spec=replay_spec,
    model_kinds=("mlp", "conv", "custom", "encoders"),
    recurrence="only",  # the LSTM core is the point
)
"""R2D2, as the runtime knows it."""
