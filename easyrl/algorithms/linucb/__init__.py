"""LinUCB (Li et al. 2010, "disjoint" linear model per arm) on the distributed runtime.

Per arm k, with contexts x_t of the steps that pulled arm k and their rewards r_t:

    A_k = ridge * I + sum_t x_t x_t^T      [d, d]
    b_k = sum_t r_t x_t                     [d]
    theta_k = A_k^-1 b_k
    pull argmax_k  theta_k . x + alpha * sqrt(x^T A_k^-1 x)

How it maps onto the runtime (flow "async_replay" with a trajectory FIFO):
- A `[K, d, d]` and b `[K, d]` are the PS variables (`linucb/A`, `linucb/b`), initialised to
  ridge * I and 0.
- Actors pull A and b like any weights and act with the UCB rule above; each env step is one
  item (context, arm, reward) shipped to memory.
- The memory shard is a FIFO (`replay.kind: trajectory`): a sample removes what it returns, so
  every logged step reaches exactly one learner batch.
- The learner turns a batch into the increments dA_k = sum x x^T and db_k = sum r x of the
  arms it pulled and pushes their NEGATIVES as "gradients": the PS applies them with plain SGD
  at learning rate 1 (x <- x - 1 * g), which adds the increments. Sums commute, so a late push
  is as right as a fresh one: the PS never drops one as stale (`Params.max_staleness`), and
  after every item has been pushed A and b hold exactly the sums above (up to float32
  rounding), whatever the order or the number of learners.

Actors act on A and b as of their last weight pull (`actor.weight_sync_every`): LinUCB with
slightly delayed feedback. The `model` section is not used. `greedy` (evaluation, export)
pulls argmax_k theta_k . x, without the exploration bonus.
"""

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, ReplayAgent
from easyrl.errors import ConfigError, check_ranges


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


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> ReplayAgent:
    """Builds the TF side of LinUCB (imports TensorFlow; see `agent.LinUCB`); `model`,
    `seed` and `learner` do not matter: A and b start at ridge * I and 0 everywhere.

    Raises:
        ConfigError: unsupported spaces (see `check_spaces`).
    """
    check_spaces(obs_space, action_space)
    from easyrl.algorithms.linucb.agent import LinUCB

    return LinUCB(params, obs_space, action_space)


SPEC = AlgorithmSpec(
    flow="async_replay",  # actors ship logged steps, learners turn them into A/b increments
    replay_kinds=("trajectory",),  # FIFO: every logged step reaches exactly one batch
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
)
"""LinUCB, as the runtime knows it."""
