"""CartPole without its velocities: a partially observed task for recurrent policies.

`easyrl/StatelessCartPole-v1` (registered when `easyrl.envs` is imported) is gymnasium's
CartPole-v1 (500-step limit, reward 1 per step) whose observation keeps only the cart position
and the pole angle: the velocities `x_dot` and `theta_dot` are dropped, so a policy must
infer them from the history (RLlib's examples of an LSTM policy use the same task). A
feed-forward policy sees where the pole is and cannot tell how fast it falls.

The two are given as fractions of the limits that end an episode, `[x / 2.4, theta / (12
degrees)]` (in [-1, 1] while it runs): the raw values are a few hundredths, their changes
per step a few thousandths, too small a signal for a recurrent core to pick the velocities
out of in any reasonable time (measured: an LSTM policy stayed at a random policy's return
for 800 updates on the raw values and learned at once on scaled ones). Nothing else is
normalized: IMPALA has no running observation statistics.
"""

import gymnasium
import numpy as np

ENV_ID = "easyrl/StatelessCartPole-v1"
"""The registered id of the velocity-free CartPole."""

KEPT = (0, 2)
"""Indices of CartPole's observation that stay: cart position, pole angle."""

LIMITS = np.array([2.4, 12 * 2 * np.pi / 360], np.float32)
"""CartPole's termination thresholds of those two: the observation is divided by them."""


class StatelessObservation(gymnasium.ObservationWrapper):
    """Keeps the `KEPT` components of CartPole's observation, divided by their `LIMITS`
    (float32 `[2]`)."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gymnasium.spaces.Box)
        low, high = space.low[list(KEPT)] / LIMITS, space.high[list(KEPT)] / LIMITS
        self.observation_space = gymnasium.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation):
        return np.asarray(observation, np.float32)[list(KEPT)] / LIMITS


def make(**kwargs) -> gymnasium.Env:
    """CartPole-v1 (its physics, no step limit: the registration adds 500) seen without
    velocities; `kwargs` go to CartPole's constructor."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return StatelessObservation(CartPoleEnv(**kwargs))


def register() -> None:
    """Registers `ENV_ID` with gymnasium (once), with CartPole-v1's 500-step limit."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point=f"{__name__}:make", max_episode_steps=500)
