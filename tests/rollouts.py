"""Collecting items with an agent's collector on a real env, for tests that learn from them."""

import numpy as np

from easyrl.envs import final_observations, make_vector_env


def collect(algo, env_id: str, num_envs: int, steps: int, **env_kwargs) -> list[dict]:
    """What the agent's collector (actor 0 of 1, seed 0) returns over `steps` vector steps
    of a real env."""
    env = make_vector_env(env_id, num_envs, vector="sync", seed=0, **env_kwargs)
    collector = algo.collector(num_envs, 0, 0, 1)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    out = []
    try:
        for _ in range(steps):
            next_obs, reward, terminated, truncated, infos = env.step(collector.act(obs, rng))
            real = final_observations(next_obs, infos, terminated | truncated)
            item = collector.observe(reward, next_obs, real, terminated, truncated)
            if item is not None:
                out.append(item)
            obs = next_obs
    finally:
        env.close()
    return out


def joined(items: list[dict]) -> dict:
    """The items' columns concatenated."""
    return {k: np.concatenate([item[k] for item in items]) for k in items[0]}
