"""DQN and Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay."""

from dataclasses import dataclass
from typing import Literal

import numpy as np

FLOW = "async_replay"
"""Execution flow: actors ship transitions, learners sample asynchronously."""
REPLAY_KINDS = ("prioritized", "uniform")
"""Replay tables DQN works with; the first is the default."""


@dataclass(frozen=True)
class Params:
    """Hyper-parameters of DQN / Ape-X DQN."""

    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Length of the n-step return computed on the actor."""
    batch_size: int = 64
    """Transitions per learner batch."""
    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    """Optimizer the PS shards apply gradients with."""
    lr: float = 1e-3
    """Learning rate."""
    lr_decay_rate: float = 1.0
    """Multiply the learning rate by this every `lr_decay_steps` updates (1.0: constant)."""
    lr_decay_steps: int = 1000
    """Updates between learning-rate decays."""
    grad_clip: float = 40.0
    """Global-norm gradient clip (0 disables)."""
    huber_delta: float = 1.0
    """Huber loss threshold."""
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


def optimizer(params: Params):
    """The optimizer the PS shards apply this algorithm's gradients with."""
    from easyrl.algorithms.optimizers import staircase_spec

    return staircase_spec(params)


def actor_epsilon(params: Params, actor_index: int, num_actors: int, env_steps: int) -> float:
    """Ape-X exploration: eps_i = eps ** (1 + alpha * i / (N - 1)), annealed from
    `epsilon_start` over the actor's first `epsilon_anneal_steps` env steps."""
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


def build(params: Params, obs_space, action_space, model, seed: int = 0, learner: bool = False):
    """Builds the TF side of DQN (imports TensorFlow; see `agent.DQN`); every role builds
    the same networks, whatever `learner` says."""
    from easyrl.algorithms.dqn.agent import DQN

    return DQN(params, obs_space, action_space, model, seed)
