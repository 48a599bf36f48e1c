"""A custom environment for easyrl: a corridor to walk to the end of.

The config names it by `module:Class`, `env.id: my_envs:Corridor`; easyrl imports this module
(in every process of the run) and registers the class with gymnasium under a derived id.
"""

import gymnasium
import numpy as np


class Corridor(gymnasium.Env):
    """Walk right along a corridor of `length` cells, from the first cell to the last.

    Observation: the position, one-hot, float32 `[length]`. Actions: 0 left, 1 right (left
    of the first cell is a wall). Reward: +1 on reaching the last cell, which ends the
    episode; -0.01 for every other step. Episodes are truncated after `max_steps` steps.
    Best return: 1 - 0.01 * (length - 2); a random walk rarely gets there in time.

    Args:
        length: cells in the corridor, at least 2.
        max_steps: steps before the episode is truncated, at least 1.
        render_mode: accepted for gymnasium's sake; nothing is rendered.
    """

    metadata = {"render_modes": []}

    def __init__(self, length: int = 10, max_steps: int = 50, render_mode: str | None = None):
        if length < 2 or max_steps < 1:
            raise ValueError(f"need length >= 2 and max_steps >= 1, got {length}, {max_steps}")
        self.length, self.max_steps = length, max_steps
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.render_mode = render_mode
        self._position = self._steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self._position] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._position = self._steps = 0
        return self._obs(), {}

    def step(self, action):
        self._position = max(0, self._position + (1 if int(action) == 1 else -1))
        self._steps += 1
        terminated = self._position == self.length - 1
        truncated = not terminated and self._steps >= self.max_steps
        reward = 1.0 if terminated else -0.01
        return self._obs(), reward, terminated, truncated, {}
