"""PPO: clipped surrogate, GAE, synchronous rounds (actors collect, learners run epochs).

This package holds the hyper-parameters and the numpy side (GAE, the replay columns, the
runtime's hooks; `params`: what `agent.py` imports too); `agent.PPO` holds the TensorFlow side
and is imported lazily by `build`.

GAE (Schulman et al. 2016), per env, backwards in time:
    delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    value_target_t = A_t + V(s_t)
where `done = terminated | truncated`: a truncated step still bootstraps from V(final obs),
but neither kind of episode end lets the advantage flow across it.
"""

import dataclasses

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, RoundsAgent
from easyrl.algorithms.ppo import params
from easyrl.algorithms.ppo.params import Params, check_spaces, gae
from easyrl.algorithms.registry import check_model_kind

__all__ = [
    "Params",
    "SPEC",
    "build",
    "check_spaces",
    "gae",
    "optimizer",
    "replay_spec",
    "round_share",
]


def optimizer(params: Params):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import schedule_spec

    return schedule_spec(params)


def round_share(
    params: Params, num_envs: int, actor_index: int, num_actors: int, lstm: int = 0
) -> int:
    """Items one actor ships per round: `rollout_length * num_envs` env steps, or with an
    LSTM (`lstm` = `model.lstm` > 0) `num_envs` sequences of `rollout_length` steps."""
    return num_envs if lstm else params.rollout_length * num_envs


def replay_spec(params: Params, obs_space, action_space, lstm: int = 0) -> dict:
    """Columns of one env step of a round, as {name: (per-item shape, dtype)}.

    `action` is the int64 index (Discrete) or the unclipped float32 sample (Box) that `logp`
    refers to; `value` is the old value prediction and `value_target = advantage + value`.

    With an LSTM (`lstm` = `model.lstm` > 0) an item is one env's whole round, T =
    `rollout_length` steps: every column above gets a leading T, and two columns are added:
    `state` `(4 * lstm,)` float32, the cores' states (policy c, h; value c, h) before step 0
    as the actor held them, and `first` `(T,)` float32, 1 where step t starts an episode
    (the states are reset to zeros before it).

    Raises:
        ConfigError: unsupported spaces (see `check_spaces`).
    """
    check_spaces(obs_space, action_space)
    if isinstance(action_space, gym.spaces.Discrete):
        action = ((), np.dtype(np.int64))
    else:
        action = (tuple(action_space.shape), np.dtype(np.float32))
    scalar = ((), np.dtype(np.float32))
    spec = {
        "obs": (tuple(obs_space.shape), np.dtype(np.float32)),
        "action": action,
        "logp": scalar,
        "advantage": scalar,
        "value_target": scalar,
        "value": scalar,
    }
    if not lstm:
        return spec
    t = params.rollout_length
    spec = {name: ((t, *shape), dtype) for name, (shape, dtype) in spec.items()}
    spec["state"] = ((4 * int(lstm),), np.dtype(np.float32))
    spec["first"] = ((t,), np.dtype(np.float32))
    return spec


def build(
    params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False
) -> RoundsAgent:
    """Builds the TF side of PPO (imports TensorFlow; see `agent.PPO`). Only a learner
    (`learner=True`) splits minibatches over several GPUs; actors never do.

    Raises:
        ConfigError: `model.kind` is not one of `SPEC.model_kinds`, the spaces are unsupported,
            or a custom torso breaks the contract of `easyrl.models.build_torso`.
    """
    check_model_kind("ppo", model, SPEC.model_kinds)
    check_spaces(obs_space, action_space)
    from easyrl.algorithms.ppo.agent import PPO

    if not learner:
        params = dataclasses.replace(params, multi_gpu=False)
    return PPO(params, obs_space, action_space, model, seed)


SPEC = AlgorithmSpec(
    flow=params.FLOW,  # the agent's (`agent.py` reads it from `params`)
    replay_kinds=("aggregate",),  # whole rounds of steps
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
    round_share=round_share,
    model_kinds=("mlp", "custom", "encoders"),  # `pi/torso`, `vf/torso` on flat observations
    recurrence="optional",  # the policy and the value network each get an LSTM core
    action_masks=True,  # no illegal action is acted or explored
    multiagent=True,
)
"""PPO, as the runtime knows it."""
