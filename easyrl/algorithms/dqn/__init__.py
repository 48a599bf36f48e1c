"""DQN and Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay, and the
rest of Rainbow (Hessel et al. 2018) as switches: a C51 distributional head (`num_atoms`,
`v_min`, `v_max`) and NoisyNet heads (`noisy_sigma`). All six on = Rainbow."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import check_ranges


@dataclass(frozen=True)
class ApexParams(LearningRate):
    """The hyper-parameters DQN and R2D2 share: the PS optimizer, the target network and
    Ape-X's per-actor exploration. Their `Params` add their own keys and re-default some."""

    ALGORITHM: ClassVar[str] = "dqn"

    lr: float = 1e-3
    """Learning rate."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    double_q: bool = True
    """Select next actions with the online network, evaluate with the target network."""
    dueling: bool = True
    """Dueling value/advantage heads."""
    target_update_period: int = 200
    """Learner updates between target-network syncs."""
    max_staleness: int = 20
    """PS shards drop gradients computed against a version older than this many updates."""
    epsilon: float = 0.4
    """Ape-X base rate: actor i of N explores with epsilon ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Ape-X exploration exponent."""
    epsilon_start: float = 1.0
    """Initial exploration rate, annealed linearly to the actor's own rate."""
    epsilon_anneal_steps: int = 0
    """Env steps (per actor) over which epsilon is annealed; 0 means no annealing."""

    def __post_init__(self):
        check_ranges(self.ALGORITHM, self, self.checks())

    def checks(self) -> dict[str, tuple[bool, str]]:
        """{field: (holds, valid range)}, written so that NaN fails every check."""
        return {
            **lr_checks(self),
            "grad_clip": (self.grad_clip >= 0.0, ">= 0"),
            "target_update_period": (self.target_update_period >= 1, ">= 1"),
            "max_staleness": (self.max_staleness >= 0, ">= 0"),
            "epsilon": (0.0 <= self.epsilon <= 1.0, "in [0, 1]"),
            "epsilon_alpha": (self.epsilon_alpha >= 0.0, ">= 0"),
            "epsilon_start": (0.0 <= self.epsilon_start <= 1.0, "in [0, 1]"),
            "epsilon_anneal_steps": (self.epsilon_anneal_steps >= 0, ">= 0"),
        }


@dataclass(frozen=True)
class Params(ApexParams):
    """Hyper-parameters of DQN / Ape-X DQN (the optimizer, target and exploration keys:
    `ApexParams`)."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Length of the n-step return computed on the actor."""
    batch_size: int = 64
    """Transitions per learner batch."""
    huber_delta: float = 1.0
    """Huber loss threshold."""
    num_atoms: int = 1
    """1: Q values (DQN); >= 2: C51, a distribution of the return over this many atoms
    evenly spaced on [v_min, v_max], learned by cross-entropy to the projected n-step target
    (which is also the new priority)."""
    v_min: float = -10.0
    """Lowest atom of the C51 support (used when num_atoms >= 2)."""
    v_max: float = 10.0
    """Highest atom of the C51 support (used when num_atoms >= 2)."""
    noisy_sigma: float = 0.0
    """> 0: NoisyNet heads (factorized Gaussian noise, sigma initialized to this / sqrt(fan
    in), fresh noise every network call) that explore by themselves: set epsilon to 0.
    Greedy evaluation and exported policies use the noise-free means."""

    def checks(self) -> dict[str, tuple[bool, str]]:
        """{field: (holds, valid range)}, written so that NaN fails every check."""
        return {
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "n_step": (self.n_step >= 1, ">= 1"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "huber_delta": (self.huber_delta > 0.0, "> 0"),
            **super().checks(),
            "num_atoms": (self.num_atoms >= 1, ">= 1"),
            "v_min": (bool(np.isfinite(self.v_min)), "finite"),
            "v_max": (self.v_max > self.v_min and bool(np.isfinite(self.v_max)), "> v_min"),
            "noisy_sigma": (0.0 <= self.noisy_sigma < float("inf"), "finite and >= 0"),
        }


def optimizer(params: ApexParams):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


def actor_epsilon(params: ApexParams, actor_index: int, num_actors: int, env_steps: int) -> float:
    """Ape-X exploration: eps_i = eps ** (1 + alpha * i / (N - 1)), annealed from
    `epsilon_start` over the actor's first `epsilon_anneal_steps` env steps (DQN's and
    R2D2's)."""
    final = params.epsilon
    if num_actors > 1:
        final = params.epsilon ** (1 + params.epsilon_alpha * actor_index / (num_actors - 1))
    if params.epsilon_anneal_steps <= 0 or env_steps >= params.epsilon_anneal_steps:
        return final
    frac = env_steps / params.epsilon_anneal_steps
    return params.epsilon_start + frac * (final - params.epsilon_start)


def replay_spec(params: Params, obs_space, action_space) -> dict:
    """Columns of one n-step transition, as {name: (per-item shape, dtype)}; observations
    keep the space's dtype (uint8 Atari frames stay uint8)."""
    obs_shape, obs_dtype = tuple(obs_space.shape), np.dtype(obs_space.dtype)
    return {
        "obs": (obs_shape, obs_dtype),
        "action": ((), np.dtype(np.int64)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": (obs_shape, obs_dtype),
        "discount": ((), np.dtype(np.float32)),
    }


def dataset_items(params: Params, steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Batch DQN: the n-step transitions (`replay_spec` columns) of a dataset's rows (the
    rows of `easyrl.offline.dataset.read_steps`: whole episodes, sorted by episode and t),
    the ones the actors' `NStepAccumulator` makes from the same steps (in row order). For the
    row of step t, with m = min(n, steps left in its episode):

        reward   = sum_{k<m} gamma^k r_{t+k}
        next_obs = next_obs_{t+m-1}                 (the real final observation at the end)
        discount = 0 if the episode terminated at t+m-1, else gamma^m

    An episode whose last row is truncated (or carries neither flag: cut by the recorder)
    bootstraps from its final observation.

    Raises:
        DatasetError: the rows are not whole sorted episodes, or a row before an episode's
            last one is terminated or truncated.
    """
    from easyrl.offline.dataset import DatasetError, episode_bounds

    bounds = episode_bounds(steps)
    rows = np.arange(bounds[-1])  # [R]
    last = np.repeat(bounds[1:] - 1, np.diff(bounds))  # [R] last row of each row's episode
    terminated = np.asarray(steps["terminated"], bool)  # [R]
    if ((terminated | np.asarray(steps["truncated"], bool)) & (rows != last)).any():
        raise DatasetError("an episode ends (terminated or truncated) before its last row")
    m = np.minimum(params.n_step, last - rows + 1)  # [R] steps in each row's return
    reward = np.asarray(steps["reward"], np.float64)
    returns = np.zeros(len(rows))  # [R]
    for k in range(params.n_step):
        ahead = np.minimum(rows + k, last)  # [R] clipped: masked out where k >= m
        returns += np.where(k < m, params.gamma**k * reward[ahead], 0.0)
    end = rows + m - 1  # [R] row whose next_obs the transition bootstraps from
    discount = np.where(terminated[end], 0.0, float(params.gamma) ** m)
    return {
        "obs": steps["obs"],
        "action": np.asarray(steps["action"], np.int64),
        "reward": returns.astype(np.float32),
        "next_obs": steps["next_obs"][end],
        "discount": discount.astype(np.float32),
    }


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> PrioritizedAgent:
    """Builds the TF side of DQN (imports TensorFlow; see `agent.DQN`); every role builds
    the same networks, whatever `learner` says."""
    from easyrl.algorithms.dqn.agent import DQN

    return DQN(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow="async_replay",  # actors ship transitions, learners sample them asynchronously
    replay_kinds=("prioritized", "uniform"),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    dataset_items=dataset_items,  # batch DQN from a recorded dataset
    model_kinds=("mlp", "conv", "custom", "encoders"),
    action_masks=True,  # no illegal action is acted, explored or bootstrapped from
    multiagent=True,
)
"""DQN / Ape-X DQN, as the runtime knows it."""
