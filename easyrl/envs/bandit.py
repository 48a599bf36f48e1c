"""A built-in linear contextual bandit, for tests and examples of contextual-bandit algorithms
(`easyrl.algorithms.linucb`).

`easyrl/LinearBandit-v0` (registered when `easyrl.envs` is imported): every step shows a
context x, a unit vector of `dim` dimensions drawn uniformly from the sphere (by the env's
seeded `np_random`); the agent pulls one of `num_arms` arms and gets

    r = theta_k . x + noise,    noise ~ N(0, noise_std^2),

with hidden arm parameters theta_k (unit vectors too) fixed by `problem_seed`, so that every
env copy of every actor faces the same bandit. The next observation is the next context. An
"episode" is a block of `max_episode_steps` pulls (100 by default, cut by gymnasium's time
limit as a truncation): the runtime then reports the return of a block, the sum of its
rewards, and the usual episode accounting works.

`info` carries what measures a bandit algorithm: `regret`, the expected reward of the best arm
for this context minus that of the chosen arm (>= 0; its running sum is the pseudo-regret),
and `expected_reward` of the chosen arm.
"""

import gymnasium
import numpy as np

from easyrl.errors import ConfigError, EasyRLError

ENV_ID = "easyrl/LinearBandit-v0"
"""The registered id of `LinearBandit`."""


def unit_vectors(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    """`count` vectors drawn uniformly from the unit sphere in `dim` dimensions, `[count,
    dim]` float64."""
    v = rng.standard_normal((count, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class LinearBandit(gymnasium.Env):
    """A linear contextual bandit with `num_arms` arms and `dim`-dimensional contexts (see the
    module docstring).

    Args:
        num_arms: K, the number of arms (>= 2).
        dim: d, the context dimension (>= 1).
        noise_std: standard deviation of the Gaussian reward noise (>= 0).
        problem_seed: seeds the hidden arm parameters theta `[K, d]`.

    Raises:
        ConfigError: an argument out of range.
    """

    metadata = {"render_modes": []}

    def __init__(self, num_arms: int = 5, dim: int = 8, noise_std: float = 0.1, problem_seed=0):
        if num_arms < 2 or dim < 1 or not noise_std >= 0:
            raise ConfigError(
                f"LinearBandit needs num_arms >= 2, dim >= 1 and noise_std >= 0, got "
                f"num_arms={num_arms!r}, dim={dim!r}, noise_std={noise_std!r}"
            )
        self.num_arms, self.dim, self.noise_std = int(num_arms), int(dim), float(noise_std)
        self.theta = unit_vectors(np.random.default_rng(problem_seed), self.num_arms, self.dim)
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (self.dim,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(self.num_arms)
        self._context = np.zeros(self.dim)

    def expected_rewards(self, context: np.ndarray) -> np.ndarray:
        """theta_k . x of every arm for `context` `[d]` -> `[K]`."""
        return self.theta @ np.asarray(context, np.float64)

    def _next_context(self) -> np.ndarray:
        self._context = unit_vectors(self.np_random, 1, self.dim)[0]
        return self._context.astype(np.float32)

    def reset(self, *, seed=None, options=None):
        """Starts a block of pulls; returns the first context."""
        super().reset(seed=seed)
        return self._next_context(), {}

    def step(self, action):
        """Pulls arm `action` for the current context; returns the next context, the noisy
        reward, never terminates, and `info` with the step's `regret` and the chosen arm's
        `expected_reward`."""
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an arm in [0, {self.num_arms}), got {action!r}")
        means = self.expected_rewards(self._context)  # [K]
        chosen = float(means[int(action)])
        reward = chosen + self.noise_std * float(self.np_random.standard_normal())
        info = {"regret": float(means.max()) - chosen, "expected_reward": chosen}
        return self._next_context(), reward, False, False, info


def vector_regrets(infos: dict, num_envs: int) -> np.ndarray:
    """The `regret` of every sub-env of one vector step, `[num_envs]` float64, from the
    vector env's merged infos: under same-step autoreset the info of a sub-env whose block
    just ended sits in `infos["final_info"]`.

    Raises:
        EasyRLError: some sub-env reported no regret (not a `LinearBandit`).
    """
    out = np.full(num_envs, np.nan)
    for source in (infos, infos.get("final_info", {})):
        if "regret" in source:
            mask = source["_regret"]
            out[mask] = source["regret"][mask]
    if np.isnan(out).any():
        raise EasyRLError("the env reports no 'regret' in its info (is it easyrl/LinearBandit?)")
    return out


def register() -> None:
    """Registers `ENV_ID` with gymnasium (once)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point=f"{__name__}:LinearBandit", max_episode_steps=100)
