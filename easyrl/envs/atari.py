"""Atari preprocessing as configurable gymnasium wrappers (ale-py environments).

From the raw ALE env (made with ``frameskip=1`` so that frame skipping happens here):
no-op resets, frame skip with max-pooling of the last two frames, episodic life and
grey-scale and resizing (gymnasium's ``AtariPreprocessing``), reward clipping to the
sign, and a stack of the last k frames as channels, ``[H, W, k]`` uint8. Observations
stay uint8 all the way to the learner's network, which scales them.
"""

from __future__ import annotations

import importlib

import gymnasium
import numpy as np

from easyrl.errors import ConfigError


def register_ale() -> None:
    """Registers the ALE environments (``ALE/Pong-v5``, ...) with gymnasium.

    Raises:
        ConfigError: ale-py is not installed.
    """
    try:
        ale_py = importlib.import_module("ale_py")
    except ImportError as exc:
        raise ConfigError(
            "Atari environments need ale-py and opencv: pip install -e '.[atari]'"
        ) from exc
    gymnasium.register_envs(ale_py)


class ChannelsLast(gymnasium.ObservationWrapper):
    """Moves the frame-stack axis last: ``[k, H, W]`` -> ``[H, W, k]`` (what conv2d takes);
    colour stacks ``[k, H, W, 3]`` become ``[H, W, 3k]``."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        shape = env.observation_space.shape
        if shape is None:
            raise TypeError(
                f"ChannelsLast needs a shaped observation space, got {env.observation_space}"
            )
        k, h, w = shape[:3]
        channels = k * (shape[3] if len(shape) == 4 else 1)
        self.observation_space = gymnasium.spaces.Box(0, 255, (h, w, channels), np.uint8)

    def observation(self, observation):
        obs = np.asarray(observation)
        if obs.ndim == 4:  # [k, H, W, 3] -> [H, W, k, 3]
            obs = np.moveaxis(obs, 0, 2)
            return obs.reshape(*obs.shape[:2], -1)
        return np.moveaxis(obs, 0, -1)  # [H, W, k]


class SignReward(gymnasium.RewardWrapper):
    """Rewards clipped to their sign (-1, 0, +1), as DQN and IMPALA train on Atari."""

    def reward(self, reward):
        return float(np.sign(float(reward)))


def wrap(env: gymnasium.Env, atari) -> gymnasium.Env:
    """Applies the preprocessing `atari` (the config's `env.atari` section) describes.

    Args:
        env: an ALE environment made with ``frameskip=1``.
        atari: an `easyrl.config.AtariConfig`.
    """
    env = gymnasium.wrappers.AtariPreprocessing(
        env,
        noop_max=atari.noop_max,
        frame_skip=atari.frame_skip,
        screen_size=atari.screen_size,
        terminal_on_life_loss=atari.episodic_life,
        grayscale_obs=atari.grayscale,
        scale_obs=False,
    )
    if atari.clip_rewards:
        env = SignReward(env)
    env = gymnasium.wrappers.FrameStackObservation(env, atari.frame_stack)
    return ChannelsLast(env)
