"""Atari preprocessing as configurable gymnasium wrappers (ale-py environments).

From the raw ALE env (made with ``frameskip=1`` so that frame skipping happens here):
no-op resets, frame skip with max-pooling of the last two frames, grey-scale and resizing
(gymnasium's ``AtariPreprocessing``), FIRE after a reset (`FireReset`), the game's score in
the infos (`GameScore`), reward clipping to the sign, a stack of the last k frames as
channels, ``[H, W, k]`` uint8, and episodic life (`EpisodicLife`: a lost life ends the
episode, not the game). Observations stay uint8 all the way to the learner's network, which
scales them. `easyrl.envs.pool` does the same with EnvPool.
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


class FireReset(gymnasium.Wrapper):
    """Presses FIRE (action 1) for one step after each reset, for games that wait for it
    (Breakout); a reset again if that step ended the game."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            return self.env.reset(**kwargs)
        return obs, info


class GameScore(gymnasium.Wrapper):
    """Adds the game's own bookkeeping to every step's info (`easyrl.envs.game_steps`):
    ``game_reward``, the reward before any clipping, and ``game_over``, whether the game
    ended (a lost life does not end it)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, "game_reward": float(reward), "game_over": bool(terminated or truncated)}
        return obs, reward, terminated, truncated, info


class EpisodicLife(gymnasium.Wrapper):
    """A lost life terminates the episode but not the game (DeepMind's EpisodicLifeEnv): the
    reset that follows (a vector env's autoreset) returns the observation the life was lost
    on and the game goes on; only a game over starts a new game."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        self._lives = 0
        self._goes_on = None  # the observation to go on from after a lost life

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())  # pyright: ignore[reportAttributeAccessIssue]

    def reset(self, **kwargs):
        obs, self._goes_on = self._goes_on, None
        if obs is not None and kwargs.get("seed") is None:  # a seed asks for a new game
            return obs, {}
        obs, info = self.env.reset(**kwargs)
        self._lives = self._ale_lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self._ale_lives()
        if lives < self._lives and not (terminated or truncated):
            terminated, self._goes_on = True, obs
        self._lives = lives
        return obs, reward, terminated, truncated, info


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
        terminal_on_life_loss=False,
        grayscale_obs=atari.grayscale,
        scale_obs=False,
    )
    if atari.fire_reset:
        env = FireReset(env)
    env = GameScore(env)
    if atari.clip_rewards:
        env = SignReward(env)
    env = gymnasium.wrappers.FrameStackObservation(env, atari.frame_stack)
    env = ChannelsLast(env)
    return EpisodicLife(env) if atari.episodic_life else env
