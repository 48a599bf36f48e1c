"""EnvPool as a vector env backend (``env.vector: envpool``; install easyrl[envpool]).

EnvPool (https://github.com/sail-sg/envpool) steps a batch of environments in C++ threads of
this process. :class:`EnvPoolVectorEnv` wraps one pool as a ``gymnasium.vector.VectorEnv``
with easyrl's conventions, so the actor, the evaluator and everything downstream use it as
they use the sync and async vector envs:

- Same-step autoreset. EnvPool resets a finished env on the *next* step (gymnasium's
  ``NEXT_STEP`` mode). The adapter resets the envs that ended right away (EnvPool's
  ``reset(env_id)``): the step that ends an episode returns the reset observation in ``obs[i]``
  and the true last one in ``infos["final_obs"][i]`` (``infos["_final_obs"][i]`` True), and no
  extra step with reward 0 ever reaches the caller, so episode returns and lengths are exact.
- Observations as easyrl's gymnasium pipeline makes them: Atari frames ``[H, W, k]`` uint8
  channels-last (EnvPool gives ``[k, H, W]``), the same spaces, dtypes and values.
- Seeding: sub-env ``i`` of ``reset(seed=s)`` gets seed ``s + i``. EnvPool takes its seeds when
  the pool is made, so a reset with a seed rebuilds the pool, except the first reset of a pool
  made with that seed.

Supported ids: ``ALE/<Game>-v5`` for the Atari games EnvPool has (with ``env.atari``), and the
classic-control ids both EnvPool and gymnasium register (:func:`supported_ids`).

Atari preprocessing maps onto EnvPool's options (screen_size -> img_height/img_width,
grayscale -> gray_scale, frame_stack -> stack_num, frame_skip (max of the last two frames),
noop_max, clip_rewards -> reward_clip, fire_reset -> use_fire_reset, ``env.kwargs``
repeat_action_probability, full_action_space, mode, difficulty; INTER_AREA resizing as
gymnasium's ``AtariPreprocessing``). At a reset both fill the whole stack with the reset frame
(``FrameStackObservation``'s default ``padding_type="reset"``, EnvPool's ``push_all``). With
one no-op and no sticky actions the frames, rewards and ends of episodes are those of the
gymnasium pipeline pixel for pixel (tests/test_envpool.py checks it). Differences that remain:

- The random streams differ: the same seed gives other no-op counts, sticky actions and
  classic-control start states than gymnasium's envs (same distributions).
- ``noop_max: 0`` runs one no-op frame at each reset (EnvPool crashes on ``noop_max=0``).
- When a game ends in the middle of a frame skip, the newest frame of the *final*
  observation differs: gymnasium max-pools the frame buffers as they are, EnvPool takes the
  last frame played. Observations the agent acts on are not affected.
- Episodic life is the adapter's, as `easyrl.envs.atari.EpisodicLife` does it in the gymnasium
  pipeline: a drop of ``lives`` at the end of an agent step terminates the episode and the
  game goes on (no reset: the next episode starts from the same observation); only a game
  over resets. (EnvPool's own ``episodic_life`` continues the game only through its
  next-step autoreset, which same-step autoreset never reaches.)
- ``fire_reset``: EnvPool's FIRE after a reset's no-ops is not the gymnasium pipeline's
  (`easyrl.envs.atari.FireReset`, one agent step of FIRE): the frames after a reset differ.
- ``max_episode_steps`` on an Atari id counts emulator frames in the gymnasium pipeline (the
  step limit wraps the ``frameskip=1`` ALE env, reset no-ops included); here it becomes
  ``ceil(max_episode_steps / frame_skip)`` agent steps, no-ops not counted (so up to
  ``ceil(noop_max / frame_skip)`` steps more). ALE v5's 108,000-frame cap likewise.
- Infos hold only ``final_obs``/``_final_obs`` and, for Atari, ``game_reward``/``game_over``
  (:func:`easyrl.envs.game_steps`; no ``lives``, ``frame_number``, ``final_info``).

A pool runs ``min(num_envs, CPUs of this process)`` threads (:func:`default_threads`).
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from easyrl.errors import ConfigError, did_you_mean

ATARI_KWARGS = (
    "repeat_action_probability",
    "full_action_space",
    "mode",
    "difficulty",
    "max_num_frames_per_episode",
)
"""``env.kwargs`` keys an Atari id accepts with ``vector: envpool`` (ALE v5 arguments)."""

ALE_V5_DEFAULTS: dict[str, Any] = {
    "repeat_action_probability": 0.25,
    "full_action_space": False,
    "max_num_frames_per_episode": 108_000,
}
"""What gymnasium's ``ALE/<Game>-v5`` registration passes to the ALE env (sticky actions with
probability 0.25, minimal action set, games truncated at 108,000 frames)."""


def import_envpool() -> ModuleType:
    """Imports EnvPool.

    Raises:
        ConfigError: envpool is not installed.
    """
    try:
        return importlib.import_module("envpool")
    except ImportError as exc:
        raise ConfigError(
            "env.vector 'envpool' needs the envpool package: pip install -e '.[envpool]'"
        ) from exc


def _pool_tasks() -> tuple[dict[str, str], tuple[str, ...]]:
    """(easyrl id -> EnvPool task id for Atari games, classic-control ids)."""
    envpool = import_envpool()
    specs = envpool.registration.registry.specs  # task id -> (import path, spec class, kwargs)
    atari = {f"ALE/{task}": task for task, s in specs.items() if s[0] == "envpool.atari"}
    classic = tuple(
        task
        for task, s in specs.items()
        if s[0] == "envpool.classic_control" and "/" not in task and task in gymnasium.registry
    )
    return atari, classic


def supported_ids() -> list[str]:
    """The env ids ``vector: envpool`` accepts, sorted.

    Raises:
        ConfigError: envpool is not installed.
    """
    atari, classic = _pool_tasks()
    return sorted([*atari, *classic])


@dataclass(frozen=True)
class PoolTask:
    """What to make with EnvPool for one easyrl env config.

    Attributes:
        task_id: EnvPool's task id (``Pong-v5``, ``CartPole-v1``).
        atari: Whether it is an Atari game (channels-last frames, episodic life here, game
            scores in the infos).
        episodic_life: Atari only: end an episode (not the game) when a life is lost.
        options: Keyword arguments of ``envpool.make_gymnasium`` besides the task id, the
            number of envs, the seeds and the threads.
    """

    task_id: str
    atari: bool
    episodic_life: bool
    options: dict[str, Any]


def pool_task(
    env_id: str, max_episode_steps: int | None = None, kwargs: dict | None = None, atari=None
) -> PoolTask:
    """Checks that EnvPool can run `env_id` as configured and says how.

    Args:
        env_id: An id from :func:`supported_ids`.
        max_episode_steps: None (the id's own limit) or a positive step limit; for an Atari
            id, emulator frames as in the gymnasium pipeline (see the module docstring).
        kwargs: ``env.kwargs``: for Atari ids, only the keys of :data:`ATARI_KWARGS`; none
            for classic-control ids.
        atari: An `easyrl.config.AtariConfig`; required for Atari ids, refused for others.

    Returns:
        The :class:`PoolTask`.

    Raises:
        ConfigError: envpool is not installed, `env_id` is not supported (the message names
            the closest supported ids), `kwargs` holds a key EnvPool cannot honour, or
            `atari` is missing for an Atari id or given for another.
    """
    atari_tasks, classic = _pool_tasks()
    kwargs = dict(kwargs or {})
    if env_id in classic:
        if atari is not None:
            raise ConfigError(f"env.atari applies to ALE/ ids only, not to {env_id!r}")
        if kwargs:
            raise ConfigError(
                f"vector 'envpool' takes no env.kwargs for {env_id!r}, got {sorted(kwargs)}"
            )
        options: dict[str, Any] = {}
        if max_episode_steps is not None:
            options["max_episode_steps"] = int(max_episode_steps)
        return PoolTask(env_id, atari=False, episodic_life=False, options=options)
    if env_id not in atari_tasks:
        supported = sorted([*atari_tasks, *classic])
        hint = did_you_mean(env_id, supported, n=3)
        hint += " " if hint else ""
        raise ConfigError(
            f"vector 'envpool' does not support env id {env_id!r}: {hint}it runs the Atari "
            f"games as ALE/<Game>-v5 ({len(atari_tasks)} games, e.g. 'ALE/Pong-v5') and the "
            f"classic-control ids {', '.join(classic)}; use vector 'sync' or 'async' for others"
        )
    if atari is None:
        raise ConfigError(
            f"vector 'envpool' runs {env_id!r} with the Atari preprocessing only: set env.atari"
        )
    unknown = sorted(set(kwargs) - set(ATARI_KWARGS))
    if unknown:
        raise ConfigError(
            f"vector 'envpool' cannot pass env.kwargs {unknown} to {env_id!r}; "
            f"it accepts {list(ATARI_KWARGS)}"
        )
    ale = {**ALE_V5_DEFAULTS, **kwargs}
    frames = int(ale["max_num_frames_per_episode"])
    if max_episode_steps is not None:
        frames = min(frames, int(max_episode_steps))
    options = {
        "img_height": atari.screen_size,
        "img_width": atari.screen_size,
        "gray_scale": atari.grayscale,
        "stack_num": atari.frame_stack,
        "frame_skip": atari.frame_skip,
        # EnvPool runs 1 to noop_max no-ops (as gymnasium) but crashes on noop_max 0.
        "noop_max": max(1, atari.noop_max),
        # Life loss is handled by the adapter (module docstring).
        "episodic_life": False,
        "reward_clip": atari.clip_rewards,  # the raw reward stays in info["reward"]
        "use_fire_reset": atari.fire_reset,
        "use_inter_area_resize": True,
        "repeat_action_probability": float(ale["repeat_action_probability"]),
        "full_action_space": bool(ale["full_action_space"]),
        "max_episode_steps": math.ceil(frames / atari.frame_skip),
    }
    for key in ("mode", "difficulty"):
        if kwargs.get(key) is not None:
            options[key] = int(kwargs[key])
    return PoolTask(
        atari_tasks[env_id], atari=True, episodic_life=atari.episodic_life, options=options
    )


def default_threads(num_envs: int) -> int:
    """EnvPool threads of a pool of `num_envs` envs: one per env, at most one per CPU this
    process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(int(num_envs), cpus))


class EnvPoolVectorEnv(gymnasium.vector.VectorEnv):
    """An EnvPool pool as a same-step-autoreset gymnasium vector env (module docstring).

    Args:
        task: What to make (:func:`pool_task`).
        num_envs: Number of sub-environments, at least 1.
        seed: Seed of the pool made now: sub-env ``i`` gets ``seed + i``. Pass the same seed
            to the first reset, which then does not rebuild the pool.
        num_threads: EnvPool threads (None: :func:`default_threads`).
    """

    def __init__(self, task: PoolTask, num_envs: int, seed: int = 0, num_threads=None):
        self._envpool = import_envpool()
        self.task = task
        self.num_envs = int(num_envs)
        self.num_threads = default_threads(num_envs) if num_threads is None else int(num_threads)
        self.metadata = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}
        self._pool: Any = self._make(seed=int(seed))
        self._in_order = np.arange(self.num_envs)
        self._seeds: tuple[int, ...] = tuple(int(seed) + i for i in range(self.num_envs))
        self._fresh = True  # made with self._seeds and neither reset nor stepped since
        self._lives = np.zeros(self.num_envs, np.int64)
        with warnings.catch_warnings():  # EnvPool's float64 Box bounds, cast to float32
            warnings.simplefilter("ignore", UserWarning)
            pool_obs = self._pool.single_observation_space
            pool_action = self._pool.single_action_space
        if task.atari:
            k, h, w = pool_obs.shape  # [k * channels, H, W]
            self.single_observation_space = gymnasium.spaces.Box(0, 255, (h, w, k), np.uint8)
            self.single_action_space = gymnasium.spaces.Discrete(int(pool_action.n))
        else:
            self.single_observation_space = pool_obs
            self.single_action_space = pool_action
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def _make(self, **seeding):
        """A new pool of this env's task, seeded by `seeding` (``seed=`` or ``env_seed=``)."""
        return self._envpool.make_gymnasium(
            self.task.task_id,
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            num_threads=self.num_threads,
            **seeding,
            **self.task.options,
        )

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        """EnvPool's observations as easyrl's: Atari ``[N, k, H, W]`` -> ``[N, H, W, k]``, a
        frame at a time (3-4x faster than one strided copy: 34 against 115 µs for 16 envs of
        42x42x4, 144 against 462 µs at 84x84x4)."""
        if self.task.atari:
            n, k, *hw = obs.shape
            out = np.empty((n, *hw, k), obs.dtype)
            for i in range(k):
                out[..., i] = obs[:, i]
            return out
        return np.array(obs, copy=True)

    def _reset_pool(self, env_ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Resets sub-envs `env_ids` (None: all); returns (their observations, the sub-env id
        of each row). Their lives are recorded for episodic life."""
        if env_ids is None:
            obs, info = self._pool.reset()
        else:
            obs, info = self._pool.reset(env_ids.astype(np.int32))
        ids = np.asarray(info["env_id"], np.int64)
        if self.task.atari:
            self._lives[ids] = info["lives"]
        return self._obs(obs), ids

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        """Resets every sub-environment.

        Args:
            seed: None: go on with each env's random stream; an int ``s``: sub-env ``i`` gets
                seed ``s + i``; a list: one int seed per sub-env. A seed rebuilds the pool
                unless it is the one the pool was just made with.
            options: Not supported (must be None).

        Returns:
            ``(obs, infos)``: observations ``[N, *obs_shape]`` and an empty infos dict.

        Raises:
            ConfigError: `seed` is not None, an int or a list of `num_envs` ints, or `options`
                is not None.
        """
        if options is not None:
            raise ConfigError(f"EnvPoolVectorEnv.reset takes no options, got {options!r}")
        if seed is not None:
            seeds = self._seed_list(seed)
            if not (self._fresh and seeds == self._seeds):
                self._pool = None  # release the old pool's threads before making the new one
                self._pool = self._make(env_seed=list(seeds))
                self._seeds = seeds
        self._fresh = False
        obs, ids = self._reset_pool(None)
        out = np.empty_like(obs)
        out[ids] = obs
        return out, {}

    def _seed_list(self, seed) -> tuple[int, ...]:
        """The per-env seeds `seed` (an int or a list of ints) gives."""
        if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            return tuple(int(seed) + i for i in range(self.num_envs))
        if (
            isinstance(seed, list | tuple)
            and len(seed) == self.num_envs
            and all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in seed)
        ):
            return tuple(int(s) for s in seed)
        raise ConfigError(
            f"seed must be None, an int or a list of {self.num_envs} ints, got {seed!r}"
        )

    def step(self, actions):
        """Steps every sub-environment once; resets at once those whose episode ended (with
        episodic life, only those whose game ended).

        Returns:
            ``(obs, rewards, terminated, truncated, infos)`` as a ``SAME_STEP`` gymnasium
            vector env returns them: float64 rewards, bool flags, for ended sub-envs their
            next episode's first observation in `obs` and their last one in
            ``infos["final_obs"]``; for Atari ``infos["game_reward"]`` (the raw rewards) and
            ``infos["game_over"]`` (:func:`easyrl.envs.game_steps`).
        """
        self._fresh = False
        obs, rewards, terminated, truncated, info = self._pool.step(np.asarray(actions))
        obs = self._obs(obs)
        columns = [
            np.asarray(rewards, np.float64),
            np.asarray(terminated, bool),
            np.asarray(truncated, bool),
        ]
        if self.task.atari:
            columns += [np.asarray(info["reward"], np.float64), np.asarray(info["lives"], np.int64)]
        ids = np.asarray(info["env_id"], np.int64)
        if not np.array_equal(ids, self._in_order):  # a pool of batch num_envs keeps the order
            order = np.argsort(ids)
            obs, columns = obs[order], [c[order] for c in columns]
        rewards, terminated, truncated = columns[:3]
        infos: dict[str, Any] = {}
        game_over = terminated | truncated
        if self.task.atari:
            raw, lives = columns[3:]
            if self.task.episodic_life:
                terminated = terminated | (lives < self._lives)
            self._lives = lives
            every = np.ones(self.num_envs, bool)
            infos = {"game_reward": raw, "_game_reward": every}
            infos.update(game_over=game_over.copy(), _game_over=every.copy())
        done = np.flatnonzero(terminated | truncated)
        if done.size:
            final = np.full(self.num_envs, None, dtype=object)
            mask = np.zeros(self.num_envs, bool)
            for i in done:
                final[i] = obs[i].copy()
            mask[done] = True
            ended = np.flatnonzero(game_over)
            if ended.size:  # a lost life goes on from the same observation
                reset_obs, reset_ids = self._reset_pool(ended)
                obs[reset_ids] = reset_obs
            infos.update(final_obs=final, _final_obs=mask)
        return obs, rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Drops the pool (EnvPool joins its threads when the pool is freed)."""
        self._pool = None
