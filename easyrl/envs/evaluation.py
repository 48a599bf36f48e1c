"""Playing whole episodes to score a policy (the evaluator, `easyrl rollout`, `easyrl.load`):
`play_episodes` on a same-step-autoreset vector env from `easyrl.envs.make_vector_env`, the
policies it plays (`EpisodicPolicy`, `Stateless`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

__all__ = ["EpisodicPolicy", "Stateless", "play_episodes"]


class EpisodicPolicy(Protocol):
    """What `play_episodes` plays on a vector env: actions for the envs' observations, and
    after each step the news of which envs' episodes ended (a recurrent policy restarts their
    state, `easyrl.algorithms.agent_parts.RecurrentGreedy`; a stateless one ignores it)."""

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions `[N, ...]` for observations `[N, ...]`."""
        ...

    def end_episodes(self, done: np.ndarray) -> None:
        """Takes the done flags `[N]` of the last step."""
        ...


@dataclasses.dataclass(frozen=True)
class Stateless:
    """A policy without state (`act(obs) -> actions`) as an `EpisodicPolicy`."""

    act: Callable[[np.ndarray], np.ndarray]
    """Actions `[N, ...]` for observations `[N, ...]`."""

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self.act(obs)

    def end_episodes(self, done: np.ndarray) -> None:
        """Nothing to restart: the next observation is all the policy needs."""


def play_episodes(
    env, policy: EpisodicPolicy, episodes: int, seed: int, stop=None, on_episode=None
) -> tuple[list[float], list[int]]:
    """Plays `episodes` whole episodes on a same-step-autoreset vector env with
    `policy(obs) -> actions`; after each step `policy.end_episodes(done)` hears which episodes
    ended (wrap a stateless function in `Stateless`).

    Sub-env i starts from a reset with seed `seed + i`; an env stops counting once every
    episode still to play has been handed out, so exactly `episodes` episodes come back
    (fewer only if `stop`, a threading.Event, is set).

    Args:
        on_episode: called as `on_episode(index, return, length)` when an episode ends.

    Returns:
        (returns, lengths) of the episodes, in the order they ended.
    """
    n = env.num_envs
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(n)
    lengths = np.zeros(n, np.int64)
    running = np.arange(n) < episodes  # envs whose current episode counts
    started = int(running.sum())
    done_returns: list[float] = []
    done_lengths: list[int] = []
    while len(done_returns) < episodes and not (stop is not None and stop.is_set()):
        obs, rewards, terminated, truncated, _ = env.step(policy(obs))
        returns += rewards
        lengths += 1
        done = np.asarray(terminated | truncated)
        policy.end_episodes(done)
        for i in np.flatnonzero(done & running):
            done_returns.append(float(returns[i]))
            done_lengths.append(int(lengths[i]))
            if on_episode is not None:
                on_episode(len(done_returns) - 1, done_returns[-1], done_lengths[-1])
            # Same-step autoreset: obs[i] already starts the next episode.
            running[i] = started < episodes
            started += int(running[i])
        returns[done] = 0.0
        lengths[done] = 0
    return done_returns, done_lengths
