"""Environment creation: vectorized gymnasium environments with same-step autoreset.

Every vector environment built here uses ``gymnasium.vector.AutoresetMode.SAME_STEP``: when
sub-environment ``i`` terminates or is truncated on a step, that same step already returns the
*reset* observation in ``obs[i]`` and the true last observation in ``infos["final_obs"][i]``
(with ``infos["_final_obs"][i] == True``). :func:`final_observations` rebuilds the true
``s_{t+1}`` rows from that convention.

Asynchronous vector environments run every sub-environment in a subprocess started with the
``"spawn"`` multiprocessing context (:data:`ASYNC_CONTEXT`). The parent process of an easyrl
actor has usually imported TensorFlow and runs gRPC threads; ``fork`` would copy that
multi-threaded state (locks held by other threads, the TF runtime, gRPC's event engine) into the
children, which can deadlock or crash them. ``spawn`` starts each child from a fresh
interpreter, works on every platform, and costs only a slower start. As with any ``spawn``
program, an entry script must guard its top-level work with ``if __name__ == "__main__":``.

``vector="envpool"`` steps the envs in EnvPool's C++ threads instead (Atari and classic-control
ids; easyrl[envpool]), through an adapter with the same conventions: see `easyrl.envs.pool`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.registration import EnvSpec

from easyrl.errors import ConfigError, EasyRLError, did_you_mean
from easyrl.imports import import_module

__all__ = [
    "ASYNC_CONTEXT",
    "VECTOR_MODES",
    "env_options",
    "env_spaces",
    "evaluation_options",
    "final_observations",
    "game_steps",
    "make_vector_env",
]

ASYNC_CONTEXT = "spawn"
"""Multiprocessing start method of the ``async`` mode's env subprocesses (safe with TF/gRPC
threads)."""

VECTOR_MODES = ("sync", "async", "envpool")
"""Accepted values of ``make_vector_env(vector=...)``."""

CUSTOM_NAMESPACE = "easyrl-custom"
"""Gymnasium namespace of the ids under which ``"module:MyEnv"`` environment classes are
registered."""


def _resolve_spec(env_id: str) -> EnvSpec:
    """Looks up the registered spec of an environment id.

    Accepts gymnasium's ``"module:EnvId-v0"`` form too: the module is imported first so that it
    registers its environments, exactly as ``gymnasium.make`` does. When no environment is
    registered under the part after the colon but the module has an attribute of that name (a
    ``gymnasium.Env`` subclass, or a function returning an env), ``"module:MyEnv"`` is
    registered as ``"easyrl-custom/module.MyEnv-v0"`` with that entry point and used: every
    process of a run registers it the same way.

    Args:
        env_id: A registered environment id, optionally prefixed by ``"module:"``, or
            ``"module:MyEnv"`` naming an environment class or factory.

    Returns:
        The environment's ``EnvSpec``.

    Raises:
        ConfigError: `env_id` is not a non-empty string, its module cannot be imported, or no
            environment is registered under it nor defined by the module; the message lists
            the closest registered ids.
    """
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError(f"env_id must be a non-empty string, got {env_id!r}")
    name = env_id
    if env_id.startswith("ALE/"):
        from easyrl.envs.atari import register_ale

        register_ale()
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        found = import_module(module, f"environment id {env_id!r}")
        if name not in gymnasium.registry and callable(getattr(found, name, None)):
            name = _register_custom(module, name)
    try:
        return gymnasium.spec(name)
    except gymnasium.error.Error as exc:
        registered = sorted(str(key) for key in gymnasium.registry.keys())
        hint = did_you_mean(name, registered, "no similar id is registered", n=3)
        if ":" in env_id:
            hint += f" (module {module!r} defines no environment class or function {name!r})"
        raise ConfigError(f"unknown environment id {env_id!r}: {hint} ({exc})") from exc


def _register_custom(module: str, attribute: str) -> str:
    """Registers `module:attribute` (an Env class or factory) under a derived id; returns it."""
    env_id = f"{CUSTOM_NAMESPACE}/{module}.{attribute}-v0"
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point=f"{module}:{attribute}")
    return env_id


def _is_positive_int(value: object) -> bool:
    """Whether `value` is an int or numpy integer >= 1 (bools are not ints here)."""
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and int(value) >= 1


def _check_make_args(max_episode_steps: int | None, kwargs: dict | None) -> dict[str, Any]:
    """Validates the arguments passed on to ``gymnasium.make``.

    Args:
        max_episode_steps: None (the registered limit) or a positive step limit.
        kwargs: None or a dict of keyword arguments for the environment constructor.

    Returns:
        A fresh dict of the environment keyword arguments (empty when `kwargs` is None).

    Raises:
        ConfigError: `max_episode_steps` is not None or a positive int, or `kwargs` is not a
            dict with string keys.
    """
    if max_episode_steps is not None and not _is_positive_int(max_episode_steps):
        raise ConfigError(
            f"max_episode_steps must be None or a positive int, got {max_episode_steps!r}"
        )
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigError(f"kwargs must be a dict with string keys, got {kwargs!r}")
    return dict(kwargs)


def env_options(env_cfg) -> dict[str, Any]:
    """The keyword arguments of `make_vector_env` and `env_spaces` that the config's `env`
    section gives (besides the id): step limit, constructor kwargs, Atari preprocessing."""
    return {
        "max_episode_steps": env_cfg.max_episode_steps,
        "kwargs": env_cfg.kwargs,
        "atari": env_cfg.atari,
    }


def evaluation_options(env_cfg) -> dict[str, Any]:
    """`env_options` for scoring a policy (evaluator, rollout): Atari plays whole games with
    raw rewards (no episodic life, no reward clipping), so returns are game scores."""
    options = env_options(env_cfg)
    if options["atari"] is not None:
        options["atari"] = dataclasses.replace(
            options["atari"], episodic_life=False, clip_rewards=False
        )
    return options


def _make_one(spec, max_episode_steps, env_kwargs, atari) -> gymnasium.Env:
    """One environment (a module-level function, so that ``spawn``-ed workers can unpickle
    it): ``gymnasium.make`` plus the Atari preprocessing when `atari` is given; Dict and
    Tuple observations are flattened (`easyrl.envs.flat`)."""
    if atari is None:
        env = gymnasium.make(spec, max_episode_steps=max_episode_steps, **env_kwargs)
        return flat.flat_env(env)
    from easyrl.envs.atari import register_ale, wrap

    register_ale()
    # Frame skipping happens in the preprocessing, so the ALE env must not skip frames too.
    env_kwargs = {"frameskip": 1, **env_kwargs}
    env = gymnasium.make(spec, max_episode_steps=max_episode_steps, **env_kwargs)
    return wrap(env, atari)


def make_vector_env(
    env_id: str,
    num_envs: int,
    *,
    vector: str = "sync",
    seed: int = 0,
    max_episode_steps: int | None = None,
    kwargs: dict | None = None,
    atari=None,
    envs_per_worker: int = 1,
) -> gymnasium.vector.VectorEnv:
    """Builds a vector of `num_envs` copies of one environment with same-step autoreset.

    Each copy is ``gymnasium.make(spec, max_episode_steps=max_episode_steps, **kwargs)``, where
    ``spec`` is the registered spec of `env_id` resolved in this process (so environments
    registered at run time also work in ``spawn``-ed workers). The vector env uses
    ``AutoresetMode.SAME_STEP``: see :func:`final_observations`.

    The environment is returned *not* reset. The caller seeds the dynamics with its first
    reset, ``obs, infos = env.reset(seed=seed)``, which gives sub-environment ``i`` the seed
    ``seed + i``. This function seeds the action and observation spaces with `seed` so that
    ``env.action_space.sample()`` is reproducible too.

    Args:
        env_id: A registered gymnasium id (``"CartPole-v1"``), optionally ``"module:Id-v0"``.
        num_envs: Number of sub-environments, at least 1.
        vector: ``"sync"`` (all copies stepped in this process, ``SyncVectorEnv``),
            ``"async"`` (copies in subprocesses started with :data:`ASYNC_CONTEXT`,
            observations through shared memory: one per copy, gymnasium's
            ``AsyncVectorEnv``, or `envs_per_worker` per subprocess,
            `easyrl.envs.workers.WorkerVectorEnv`) or ``"envpool"`` (EnvPool's
            threads in this process, `easyrl.envs.pool.EnvPoolVectorEnv`; Atari and
            classic-control ids only).
        seed: Seed of the action/observation spaces; pass the same value to the first reset.
        max_episode_steps: Step limit of each episode (a ``TimeLimit`` wrapper, truncating);
            None keeps the registered limit.
        kwargs: Extra keyword arguments of the environment constructor.
        atari: An `easyrl.config.AtariConfig`: apply the Atari preprocessing of
            `easyrl.envs.atari` (the raw env is made with ``frameskip=1``); None: none.
        envs_per_worker: ``"async"`` only: copies each subprocess steps in turn.

    Returns:
        The vector environment, not yet reset. Close it with ``env.close()``.

    Raises:
        ConfigError: `env_id` is unknown (the message names the closest registered ids),
            `num_envs` is not a positive int, `vector` is not one of :data:`VECTOR_MODES`,
            `seed` is not an int, or `max_episode_steps`/`kwargs` are invalid; for
            ``"envpool"``: envpool is not installed or cannot run `env_id` as configured.
    """
    if not _is_positive_int(num_envs):
        raise ConfigError(f"num_envs must be a positive int, got {num_envs!r}")
    if vector not in VECTOR_MODES:
        raise ConfigError(f"vector must be one of {VECTOR_MODES}, got {vector!r}")
    if not _is_positive_int(envs_per_worker):
        raise ConfigError(f"envs_per_worker must be a positive int, got {envs_per_worker!r}")
    if envs_per_worker > 1 and vector != "async":
        raise ConfigError(f"envs_per_worker {envs_per_worker} needs vector 'async', got {vector!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    env_kwargs = _check_make_args(max_episode_steps, kwargs)
    env: gymnasium.vector.VectorEnv
    if vector == "envpool":
        from easyrl.envs.pool import EnvPoolVectorEnv, pool_task

        task = pool_task(env_id, max_episode_steps, env_kwargs, atari)
        env = EnvPoolVectorEnv(task, int(num_envs), seed=int(seed))
        _seed_spaces(env, int(seed))
        return env
    spec = _resolve_spec(env_id)
    env_fn = functools.partial(_make_one, spec, max_episode_steps, env_kwargs, atari)
    env_fns = [env_fn] * int(num_envs)
    mode = gymnasium.vector.AutoresetMode.SAME_STEP
    if vector == "sync":
        env = gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=mode)
    elif envs_per_worker == 1:
        env = gymnasium.vector.AsyncVectorEnv(env_fns, context=ASYNC_CONTEXT, autoreset_mode=mode)
    else:
        from easyrl.envs.workers import WorkerVectorEnv

        env = WorkerVectorEnv(env_fn, int(num_envs), int(envs_per_worker), ASYNC_CONTEXT)
    _seed_spaces(env, int(seed))
    return env


def _seed_spaces(env: gymnasium.vector.VectorEnv, seed: int) -> None:
    """Seeds the action and observation spaces of `env` (batched and single) with `seed`."""
    env.action_space.seed(seed)
    env.single_action_space.seed(seed)
    env.observation_space.seed(seed)
    env.single_observation_space.seed(seed)


def env_spaces(
    env_id: str, max_episode_steps: int | None = None, kwargs: dict | None = None, atari=None
) -> tuple[gymnasium.Space, gymnasium.Space]:
    """Reads the observation and action spaces of a single environment.

    Makes one environment, reads its spaces and closes it.

    Args:
        env_id: A registered gymnasium id, optionally ``"module:Id-v0"``.
        max_episode_steps: As in :func:`make_vector_env`.
        kwargs: Extra keyword arguments of the environment constructor.
        atari: As in :func:`make_vector_env`.

    Returns:
        ``(observation_space, action_space)`` of one (non-vectorized) environment; a Dict
        or Tuple observation space comes back as the flat `easyrl.envs.flat.FlatBox` that
        the envs built here observe.

    Raises:
        ConfigError: `env_id` is unknown, needs a package that is not installed, or
            `max_episode_steps`/`kwargs` are invalid.
    """
    env_kwargs = _check_make_args(max_episode_steps, kwargs)
    spec = _resolve_spec(env_id)
    try:
        env = _make_one(spec, max_episode_steps, env_kwargs, atari)
    except (gymnasium.error.DependencyNotInstalled, ModuleNotFoundError) as err:
        extra = extra_for(spec)
        if extra is None and not isinstance(err, gymnasium.error.DependencyNotInstalled):
            raise  # not one of the env families easyrl's extras install
        hint = f"; pip install 'easyrl[{extra}]' installs it" if extra else ""
        raise ConfigError(
            f"env.id: {env_id!r} needs a package that is not installed: {err}{hint}"
        ) from err
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


EXTRAS = {"gymnasium.envs.box2d": "box2d", "gymnasium.envs.mujoco": "mujoco", "ale_py": "atari"}
"""easyrl's extra (setup.py) that installs each env family, by its entry point's module."""


def extra_for(spec: EnvSpec) -> str | None:
    """The extra of `EXTRAS` that installs `spec`'s env family, or None."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    return next((x for m, x in EXTRAS.items() if entry.startswith(m)), None)


def game_steps(infos: dict, num_envs: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The games' own bookkeeping of one vector step, where the env keeps one (Atari:
    `easyrl.envs.atari.GameScore`, `easyrl.envs.pool`): ``(raw rewards [N], game over [N])``,
    read from ``infos`` and, for the sub-envs whose episode ended, ``infos["final_info"]``
    (same-step autoreset). Whole-game scores are what users compare: with episodic life or
    clipped rewards the training episodes are not games and their rewards not the score.

    Returns:
        None when the env keeps no such bookkeeping.
    """
    sources = [infos, infos.get("final_info") or {}]  # the ended envs' final step last
    if not any("game_over" in source for source in sources):
        return None
    reward, over = np.zeros(num_envs), np.zeros(num_envs, bool)
    for source in sources:
        if "game_over" in source:
            mask = np.asarray(source.get("_game_over", np.ones(num_envs, bool)), bool)
            reward[mask] = np.asarray(source["game_reward"], np.float64)[mask]
            over[mask] = np.asarray(source["game_over"], bool)[mask]
    return reward, over


def final_observations(obs: np.ndarray, infos: dict, done: np.ndarray) -> np.ndarray:
    """Rebuilds the true next observations ``s_{t+1}`` of a same-step-autoreset vector step.

    Under ``AutoresetMode.SAME_STEP`` a done sub-environment returns its reset observation in
    `obs` and its last observation in ``infos["final_obs"]`` (an object array holding None
    where not done, masked by ``infos["_final_obs"]``).

    Args:
        obs: Observations returned by ``env.step``, ``[N, *obs_shape]``.
        infos: The infos dict returned by the same step.
        done: ``terminated | truncated`` of the same step, ``[N]`` bool.

    Returns:
        A copy of `obs` (same dtype) whose done rows are replaced by their final observation.

    Raises:
        EasyRLError: `done` does not match `obs`, or a done row has no final observation in
            `infos`.
    """
    obs = np.asarray(obs)
    done = np.asarray(done, dtype=bool).reshape(-1)  # [N]
    if obs.ndim < 1 or done.shape[0] != obs.shape[0]:
        raise EasyRLError(
            f"done has {done.shape[0]} entries but obs has shape {obs.shape}; "
            "expected one done flag per sub-environment"
        )
    out = obs.copy()  # [N, *obs_shape]
    done_idx = np.flatnonzero(done)  # [D]
    if done_idx.size == 0:
        return out
    final = infos.get("final_obs")
    if final is None:
        raise EasyRLError(
            "some sub-environments are done but infos has no 'final_obs' entry; "
            "was the vector env built with AutoresetMode.SAME_STEP?"
        )
    mask = infos.get("_final_obs")
    for i in done_idx:
        if (mask is not None and not mask[i]) or final[i] is None:
            raise EasyRLError(f"sub-environment {i} is done but has no final observation")
        out[i] = final[i]
    return out


# easyrl's own environments (`easyrl/LinearBandit-v0`, see `easyrl.envs.bandit`;
# `easyrl/StatelessCartPole-v1`, see `easyrl.envs.stateless`; `easyrl/MaskedChoice-v0`, see
# `easyrl.envs.masked`) are registered with gymnasium on import, so that every process that
# creates environments knows them.
from easyrl.envs import bandit, flat, masked, stateless  # noqa: E402

bandit.register()
stateless.register()
masked.register()
