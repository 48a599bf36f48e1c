"""The numpy side that the off-policy continuous-control algorithms share (TD3 / DDPG, SAC; their
TensorFlow side is `actor_critic`, which their agents import): the network kinds they build,
the spaces they accept, and the scaling of normalized actions to the env's Box bounds:
    env_action = low + (a + 1) / 2 * (high - low),  a in [-1, 1]^A.
Nothing here imports TensorFlow.
"""

import gymnasium as gym
import numpy as np

from easyrl.algorithms.registry import check_model_kind
from easyrl.errors import ConfigError

MODEL_KINDS = ("mlp", "custom")
"""Network kinds: an MLP or a custom torso on flat observations (the actor's; the critics' take
concat(obs, normalized action))."""


def check_spaces(name: str, obs_space, action_space, model=None) -> None:
    """Checks that the actor-critic can handle these spaces (and this model).

    Raises:
        ConfigError: `model.kind` is not one of `MODEL_KINDS`, the observation is not a flat
            Box, or the action space is not a flat Box with finite bounds, low < high.
    """
    if model is not None:
        check_model_kind(name, model, MODEL_KINDS)
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"{name} needs a flat Box observation space, got {obs_space}")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ConfigError(f"{name} needs a flat Box action space, got {action_space}")
    low, high = np.asarray(action_space.low), np.asarray(action_space.high)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
        raise ConfigError(
            f"{name} needs finite Box action bounds with low < high, got {action_space}"
        )


def scale_actions(normalized: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Maps normalized actions `[N, A]` in [-1, 1] to the Box bounds:
    low + (a + 1) / 2 * (high - low), clipped to [low, high] against rounding; float32."""
    a = np.clip(np.asarray(normalized, np.float64), -1.0, 1.0)  # [N, A]
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    return np.clip(low + (a + 1.0) * 0.5 * (high - low), low, high).astype(np.float32)
