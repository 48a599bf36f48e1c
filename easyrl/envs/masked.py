"""A task with a Dict observation and an action mask, where ignoring the mask shows.

`easyrl/MaskedChoice-v0` (registered when `easyrl.envs` is imported): each step shows the
payoffs of `num_actions` actions, `{"payoff": Box(0, 1, (n,)), "action_mask": MultiBinary(n)}`;
each action is legal with probability 1/2 (at least one always is). A legal action earns its
payoff; an illegal one earns `illegal_reward` (-10) and ends the episode. Episodes last 20
steps (truncated), so an episode shorter than 20 steps or with a negative return took an
illegal action. The best policy takes the legal action of the largest payoff: about 0.73 a
step with 5 actions (14.6 an episode), a uniformly random legal one 0.5 (10). Each step's
payoffs and mask are drawn afresh: the task is a contextual bandit, so `gamma: 0` suits it.
"""

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "easyrl/MaskedChoice-v0"
"""The registered id of the masked-choice task."""

EPISODE_STEPS = 20
"""Steps of an episode in which no illegal action is taken (the registered limit)."""


class MaskedChoice(gymnasium.Env):
    """The masked-choice task (see the module docstring).

    Args:
        num_actions: n, the actions (at least 2).
        illegal_reward: the reward of an illegal action (which also ends the episode).
    """

    def __init__(self, num_actions: int = 5, illegal_reward: float = -10.0):
        if num_actions < 2:
            raise ValueError(f"num_actions must be >= 2, got {num_actions}")
        self.num_actions = num_actions
        self.illegal_reward = float(illegal_reward)
        self.observation_space = spaces.Dict(
            {
                "payoff": spaces.Box(0.0, 1.0, (num_actions,), np.float32),
                "action_mask": spaces.MultiBinary(num_actions),
            }
        )
        self.action_space = spaces.Discrete(num_actions)
        self._obs: dict[str, np.ndarray] = {}

    def _draw(self) -> dict[str, np.ndarray]:
        n = self.num_actions
        mask = (self.np_random.random(n) < 0.5).astype(np.int8)  # [n]
        mask[self.np_random.integers(n)] = 1  # at least one legal action
        payoff = self.np_random.random(n).astype(np.float32)  # [n]
        self._obs = {"payoff": payoff, "action_mask": mask}
        return self._obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        a = int(action)
        if not self._obs["action_mask"][a]:
            obs = {k: v.copy() for k, v in self._obs.items()}  # a fresh object, as gymnasium asks
            return obs, self.illegal_reward, True, False, {"illegal": True}
        reward = float(self._obs["payoff"][a])
        return self._draw(), reward, False, False, {"illegal": False}


def register() -> None:
    """Registers `ENV_ID` with gymnasium (once), with its `EPISODE_STEPS` limit."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(
            ENV_ID, entry_point=f"{__name__}:MaskedChoice", max_episode_steps=EPISODE_STEPS
        )
