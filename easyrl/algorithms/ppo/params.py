"""PPO's numpy side that `agent.py` needs too: the hyper-parameters, its flow, the space checks and
GAE.

The package re-exports all of it; `agent.py` imports it from here, not from the package,
whose `build` imports `agent.py` (no import circle).
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from easyrl.algorithms.contract import Flow
from easyrl.algorithms.learning_rate import LearningRate, lr_checks
from easyrl.errors import ConfigError, check_ranges

FLOW: Flow = "sync_rounds"
"""The flow: actors collect a round under one weight round; one learner trains."""


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
