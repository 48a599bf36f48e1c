"""PPO: clipped surrogate, GAE, synchronous rounds (actors collect, learners run epochs).

This module holds the hyper-parameters and the numpy side (GAE, the replay columns, the
runtime's hooks); `agent.PPO` holds the TensorFlow side and is imported lazily by `build`.

GAE (Schulman et al. 2016), per env, backwards in time:
    delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    value_target_t = A_t + V(s_t)
where `done = terminated | truncated`: a truncated step still bootstraps from V(final obs),
but neither kind of episode end lets the advantage flow across it.
"""

import dataclasses
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec, RoundsAgent
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.algorithms.registry import check_model_kind
from easyrl.errors import ConfigError, check_ranges


@dataclass(frozen=True)
class Params(LearningRate):
    """Hyper-parameters of PPO (clipped surrogate, GAE, synchronous rounds)."""

    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda (0: one-step TD advantages, 1: Monte-Carlo returns minus the value)."""
    rollout_length: int = 128
    """Vector steps each actor collects per round."""
    num_epochs: int = 10
    """Passes over the round's batch."""
    minibatch_size: int = 256
    """Items per gradient step (the batch is split into ceil(n / size) near-equal parts)."""
    clip: float = 0.2
    """Surrogate clip: the ratio is clipped to [1 - clip, 1 + clip]."""
    value_clip: float = 0.0
    """Clip the value prediction to old value +- this in a second squared error and take the
    larger of the two (0 disables: plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch: (A - mean) / (std + 1e-8)."""
    kl_target: float = 0.0
    """Early stop (0 disables): after an epoch whose minibatches' mean approximate KL exceeds
    1.5 * kl_target, the round's remaining epochs are skipped."""
    lr: float = 3e-4
    """Learning rate."""
    grad_clip: float = 0.5
    """Global-norm gradient clip (0 disables)."""
    max_staleness: int = 1_000_000
    """PS shards drop gradients older than this many updates (rounds are synchronous, so
    effectively off)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions only)."""
    multi_gpu: bool = True
    """Split each minibatch over all visible GPUs with a MirroredStrategy when there are >1."""
    normalize_observations: bool = False
    """Feed the networks (obs - mean) / std, clipped to +-obs_clip; the running mean/std is
    updated by the learner after every round and kept on the PS, so all actors share it."""
    obs_clip: float = 10.0
    """Clip of the normalized observations."""

    def __post_init__(self):
        # (holds, valid range); written so that NaN fails every check.
        checks = {
            "gamma": (0.0 <= self.gamma <= 1.0, "in [0, 1]"),
            "lam": (0.0 <= self.lam <= 1.0, "in [0, 1]"),
            "rollout_length": (self.rollout_length >= 1, ">= 1"),
            "num_epochs": (self.num_epochs >= 1, ">= 1"),
            "minibatch_size": (self.minibatch_size >= 1, ">= 1"),
            "clip": (self.clip > 0.0, "> 0"),
            "value_clip": (self.value_clip >= 0.0, ">= 0"),
            "vf_coef": (self.vf_coef >= 0.0, ">= 0"),
            "ent_coef": (self.ent_coef >= 0.0, ">= 0"),
            "kl_target": (self.kl_target >= 0.0, ">= 0"),
            "grad_clip": (self.grad_clip >= 0.0, ">= 0"),
            "max_staleness": (self.max_staleness >= 0, ">= 0"),
            "log_std_init": (bool(np.isfinite(self.log_std_init)), "finite"),
            "obs_clip": (self.obs_clip > 0.0, "> 0"),
            **lr_checks(self),
        }
        check_ranges("ppo", self, checks)


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


def check_spaces(obs_space, action_space, name: str = "ppo") -> None:
    """Checks that PPO (or `name`, an algorithm on PPO's agent) can handle these spaces.

    Raises:
        ConfigError: the observation is not a flat Box, or the action space is neither
            Discrete nor a flat bounded Box.
    """
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"{name} needs a flat Box observation, got {obs_space}")
    if isinstance(action_space, gym.spaces.Discrete):
        return
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ConfigError(f"{name} needs finite Box action bounds, got {action_space}")
        return
    raise ConfigError(f"{name} needs a Discrete or a flat Box action space, got {action_space}")


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


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    done: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates over a `[T, N]` rollout (see the module docstring).

    Args:
        rewards: r_t, `[T, N]`.
        values: V(s_t), `[T, N]`.
        next_values: V of the true successor s_{t+1}, `[T, N]`: V(final observation) for a
            truncated step, anything for a terminated step (not used: the bootstrap is 0),
            otherwise V(next observation).
        terminated: `[T, N]` bool, the episode ended in a terminal state at step t.
        done: `[T, N]` bool, `terminated | truncated`: the lambda recursion is cut here
            (terminated steps cut it even when `done` misses them).
        gamma: discount.
        lam: GAE lambda.

    Returns:
        (advantages, value_targets), both `[T, N]` float32; computed in float64, and
        `value_targets = advantages + values` in float32 (equal to the float32 sum exactly).

    Raises:
        ValueError: the inputs are not all `[T, N]` of the same shape.
    """
    r = np.asarray(rewards, np.float64)  # [T, N]
    v = np.asarray(values, np.float64)
    nv = np.asarray(next_values, np.float64)
    term = np.asarray(terminated, bool)
    cut = np.asarray(done, bool) | term
    if r.ndim != 2 or any(x.shape != r.shape for x in (v, nv, term, cut)):
        shapes = [np.shape(x) for x in (rewards, values, next_values, terminated, done)]
        raise ValueError(f"gae needs five [T, N] arrays of one shape, got shapes {shapes}")
    # Terminated: no bootstrap (np.where, so a NaN in an unused next value cannot leak).
    bootstrap = np.where(term, 0.0, gamma * nv)  # [T, N]
    deltas = r + bootstrap - v  # [T, N]
    carry = gamma * lam * (~cut)  # [T, N]
    advantages = np.zeros_like(r)
    running = np.zeros(r.shape[1])  # [N]
    for t in reversed(range(r.shape[0])):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    advantages = advantages.astype(np.float32)
    return advantages, advantages + np.asarray(values, np.float32)


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
    flow="sync_rounds",  # actors collect a round under one weight round; one learner trains
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
