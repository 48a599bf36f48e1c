"""DQN and Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay, and the
rest of Rainbow (Hessel et al. 2018) as switches: a C51 distributional head (`num_atoms`,
`v_min`, `v_max`) and NoisyNet heads (`noisy_sigma`). All six on = Rainbow."""

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, PrioritizedAgent
from easyrl.algorithms.dqn import params
from easyrl.algorithms.dqn.params import ApexParams, Params, actor_epsilon

__all__ = [
    "ApexParams",
    "Params",
    "SPEC",
    "actor_epsilon",
    "build",
    "dataset_items",
    "optimizer",
    "replay_spec",
]


def optimizer(params: ApexParams):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


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
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("prioritized", "uniform"),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    dataset_items=dataset_items,  # batch DQN from a recorded dataset
    model_kinds=("mlp", "conv", "custom", "encoders"),
    action_masks=True,  # no illegal action is acted, explored or bootstrapped from
    multiagent=True,
    fused_update=True,  # `agent.fuse_update`: a lone learner's update in one call
)
"""DQN / Ape-X DQN, as the runtime knows it."""
