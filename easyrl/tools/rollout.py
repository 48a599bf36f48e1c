"""`easyrl rollout`: the greedy policy of a run's checkpoint, played on fresh environments.

A run directory holds everything needed to rebuild its policy without any server:
`config.yaml` (the resolved config) gives the algorithm, the model and the environment,
and `checkpoints/` holds the weights, either

- `best.npz`, the evaluator's best weights so far (`var/<name>` arrays and `meta`), or
- `ps-<i>.npz`, one per PS shard, each with the `var/<name>` arrays of ITS variables (plus
  optimizer slots and `meta`): the union of every shard's variables is the latest model.

`load_policy` rebuilds the algorithm and assigns a checkpoint's weights by name; `rollout`
plays whole episodes with `algo.greedy`; `easyrl export` reuses `load_policy`.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.envs import env_options, env_spaces, evaluation_options, make_vector_env, play_episodes
from easyrl.errors import EasyRLError
from easyrl.imports import add_import_roots
from easyrl.seeds import derive_seed

__all__ = [
    "CHECKPOINTS",
    "LoadedPolicy",
    "RolloutResult",
    "checkpoint_values",
    "load_policy",
    "rollout",
    "run_config",
]

CHECKPOINTS = ("best", "latest")
"""Which weights to load: the evaluator's best (`best.npz`) or the PS shards' last
(`ps-<i>.npz`); None picks `best` when it exists, else `latest`."""


_PS_CHECKPOINT = re.compile(r"ps-(\d+)\.npz")  # not ps-0.tmp.npz, a checkpoint being written


class LoadedPolicy(NamedTuple):
    """An algorithm rebuilt from a run directory, holding a checkpoint's weights.

    Attributes:
        cfg: the run's config (from `config.yaml`).
        algo: the algorithm's TF side (`variables`, `greedy`, `greedy_fn`).
        obs_space: the observation space of one environment.
        action_space: the action space of one environment.
        checkpoint: which weights were loaded: "best" or "latest".
        files: the checkpoint files they came from.
    """

    cfg: config_lib.Config
    algo: Any
    obs_space: Any
    action_space: Any
    checkpoint: str
    files: list[Path]


class RolloutResult(NamedTuple):
    """The episodes a rollout played, in the order they ended.

    Attributes:
        returns: the undiscounted return of each episode.
        lengths: the number of steps of each episode.
        checkpoint: "best" or "latest".
    """

    returns: list[float]
    lengths: list[int]
    checkpoint: str

    @property
    def mean(self) -> float:
        """The mean return (nan without episodes)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")


def run_config(run_dir: str | Path) -> config_lib.Config:
    """Loads a run directory's resolved config.

    Raises:
        EasyRLError: `run_dir` is not a directory or has no `config.yaml`.
        ConfigError: `config.yaml` is invalid.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EasyRLError(f"run directory {str(run_dir)!r} does not exist")
    add_import_roots(Path.cwd())  # custom modules the run names, as `easyrl train` finds them
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise EasyRLError(
            f"{str(run_dir)!r} is not a run directory: it has no config.yaml "
            "(expected the directory a run writes, e.g. runs/<name>-<time>/)"
        )
    return config_lib.load(path)


def _read_vars(path: Path) -> dict[str, np.ndarray]:
    """The `var/<name>` arrays of one checkpoint file, by name."""
    try:
        with np.load(path) as data:
            return {k[len("var/") :]: data[k] for k in data.files if k.startswith("var/")}
    except (OSError, ValueError) as err:
        raise EasyRLError(f"cannot read checkpoint {str(path)!r}: {err}") from err


def checkpoint_values(
    run_dir: str | Path, checkpoint: str | None = None
) -> tuple[str, list[Path], dict[str, np.ndarray]]:
    """Reads the weights of a run's checkpoint.

    Args:
        run_dir: the run directory.
        checkpoint: "best" (`checkpoints/best.npz`), "latest" (the union of every
            `checkpoints/ps-<i>.npz`), or None: "best" when it exists, else "latest".

    Returns:
        (the checkpoint chosen, the files read, {variable name: array}).

    Raises:
        EasyRLError: an unknown `checkpoint`, no such checkpoint, an unreadable file, or a
            variable held by two PS shards.
    """
    directory = Path(run_dir) / "checkpoints"
    best = directory / "best.npz"
    if checkpoint is None:
        checkpoint = "best" if best.is_file() else "latest"
    if checkpoint not in CHECKPOINTS:
        raise EasyRLError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}")
    if checkpoint == "best":
        if not best.is_file():
            raise EasyRLError(
                f"no best checkpoint: {str(best)!r} does not exist (only a run with an "
                "evaluator, cluster.evaluator: 1, writes it); use --checkpoint latest"
            )
        return checkpoint, [best], _read_vars(best)
    matches = ((_PS_CHECKPOINT.fullmatch(p.name), p) for p in directory.glob("ps-*.npz"))
    numbered = sorted(((int(m[1]), p) for m, p in matches if m), key=lambda pair: pair[0])
    shards = [p for _, p in numbered]
    if not shards:
        other = "; use --checkpoint best" if best.is_file() else ", and no best.npz either"
        raise EasyRLError(
            f"no PS checkpoint (ps-<i>.npz) in {str(directory)!r}{other} (PS shards write "
            "them every run.checkpoint_interval_s and when the run stops)"
        )
    values: dict[str, np.ndarray] = {}
    for path in shards:
        for name, value in _read_vars(path).items():
            if name in values:
                raise EasyRLError(f"variable {name!r} appears in more than one PS checkpoint")
            values[name] = value
    return checkpoint, shards, values


def _assign(
    variables: Mapping[str, Any], values: dict[str, np.ndarray], files: list[Path], cfg
) -> None:
    """Assigns checkpoint `values` (read from `files`) to the model's `variables` by name,
    checking that they match exactly: names, shapes and dtypes."""
    where = ", ".join(p.name for p in files)
    missing = sorted(set(variables) - set(values))
    if missing:
        hint = ""
        if files[0].name != "best.npz" and len(files) < cfg.cluster.ps:
            hint = f" (only {len(files)} of the run's {cfg.cluster.ps} PS shards wrote one)"
        raise EasyRLError(
            f"checkpoint {where} lacks {len(missing)} variable(s) of the "
            f"{cfg.algorithm.name} model in config.yaml: {', '.join(missing)}{hint}"
        )
    unknown = sorted(set(values) - set(variables))
    if unknown:
        raise EasyRLError(
            f"checkpoint {where} holds variables the {cfg.algorithm.name} model in "
            f"config.yaml does not have: {', '.join(unknown)}"
        )
    for name, var in variables.items():
        value = values[name]
        shape, dtype = tuple(var.shape), var.dtype.as_numpy_dtype
        if value.shape != shape or value.dtype != dtype:
            raise EasyRLError(
                f"checkpoint {where}: {name} is {value.shape} {value.dtype}, the model in "
                f"config.yaml expects {shape} {np.dtype(dtype)}"
            )
        var.assign(value)


def load_policy(run_dir: str | Path, checkpoint: str | None = None) -> LoadedPolicy:
    """Rebuilds a run's algorithm (no servers, on the CPU) and loads a checkpoint into it.

    Args:
        run_dir: the run directory (`config.yaml`, `checkpoints/`).
        checkpoint: "best", "latest" or None (see `checkpoint_values`).

    Returns:
        The algorithm with the checkpoint's weights, and what was loaded.

    Raises:
        EasyRLError: no run directory or checkpoint, a checkpoint that does not fit the
            model `config.yaml` describes, or a multi-agent run (no single greedy policy).
    """
    import tensorflow as tf

    cfg = run_config(run_dir)
    if cfg.multiagent.enabled:
        from easyrl.algorithms.multiagent import NO_GREEDY

        raise EasyRLError(f"{run_dir}: {NO_GREEDY}")
    chosen, files, values = checkpoint_values(run_dir, checkpoint)
    obs_space, action_space = env_spaces(cfg.env.id, **env_options(cfg.env))
    spec = registry.spec(cfg.algorithm.name)
    with tf.device("/CPU:0"):
        algo = spec.build(cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed)
        _assign(algo.variables, values, files, cfg)
    return LoadedPolicy(cfg, algo, obs_space, action_space, chosen, files)


def _require_moviepy() -> None:
    """Raises EasyRLError naming what to install unless moviepy (which RecordVideo writes
    the files with) is importable."""
    try:
        importlib.import_module("moviepy")
    except ImportError as err:
        raise EasyRLError(
            "--video needs moviepy to write the video files: pip install moviepy "
            "(or pip install 'gymnasium[other]')"
        ) from err


def _video_env(cfg, options: dict, video_dir: Path, episodes: int, seed: int):
    """One environment rendering `rgb_array` frames, every episode recorded to `video_dir`
    by `gymnasium.wrappers.RecordVideo`, as a vector env of one."""
    options = {**options, "kwargs": {**options["kwargs"], "render_mode": "rgb_array"}}
    try:
        env = make_vector_env(cfg.env.id, 1, vector="sync", seed=seed, **options)
    except (gymnasium.error.Error, TypeError, ValueError) as err:
        raise EasyRLError(f"cannot make {cfg.env.id} with render_mode='rgb_array': {err}") from err
    assert isinstance(env, gymnasium.vector.SyncVectorEnv)  # what vector="sync" makes
    # The vector env steps the sub-env through `envs[0]`; wrapping it there keeps the
    # same vector loop (and Atari preprocessing) for recorded and unrecorded rollouts.
    # Stop at the last episode: the vector env resets once more after it ends.
    env.envs[0] = gymnasium.wrappers.RecordVideo(
        env.envs[0],
        str(video_dir),
        episode_trigger=lambda episode: episode < episodes,
        name_prefix="rollout",
    )
    return env


def rollout(
    run_dir: str | Path,
    episodes: int = 10,
    checkpoint: str | None = None,
    video_dir: str | Path | None = None,
    seed: int | None = None,
    quiet: bool = False,
) -> RolloutResult:
    """Plays a run's greedy (deterministic) policy for whole episodes on fresh environments.

    The environments are the run's (`env` section), Atari without episodic life or reward
    clipping (returns are game scores, as the evaluator's), `min(episodes, eval.num_envs)`
    of them stepped together, or a single one when recording video.

    Args:
        run_dir: the run directory (`config.yaml`, `checkpoints/`).
        episodes: how many episodes to play (at least 1).
        checkpoint: "best", "latest" or None: "best" when `checkpoints/best.npz` exists.
        video_dir: record every episode as a video into this directory (needs moviepy).
        seed: the seed of the first reset (None: the run's "rollout" seed stream, so a
            rollout plays neither an actor's nor the evaluator's episodes).
        quiet: print nothing (else one line per episode and the mean, on stdout).

    Returns:
        The episodes' returns and lengths and the checkpoint used.

    Raises:
        EasyRLError: `episodes` < 1, no run directory or checkpoint, a checkpoint that does
            not fit the config, or video recording without moviepy.
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise EasyRLError(f"episodes must be a positive int, got {episodes!r}")
    if video_dir is not None:
        _require_moviepy()
    from easyrl.algorithms.shared import greedy_policy  # imports TensorFlow

    loaded = load_policy(run_dir, checkpoint)
    cfg = loaded.cfg
    out = None if quiet else sys.stdout
    seed = derive_seed(cfg.run.seed, "rollout") if seed is None else int(seed)
    options = evaluation_options(cfg.env)  # Atari: game scores, as the evaluator's
    if video_dir is not None:
        env = _video_env(cfg, options, Path(video_dir), episodes, seed)
    else:
        num_envs = min(episodes, cfg.eval.num_envs)
        env = make_vector_env(cfg.env.id, num_envs, vector="sync", seed=seed, **options)

    def report(index: int, ret: float, length: int) -> None:
        if out is not None:
            print(f"episode {index + 1}: return {ret:.1f}, length {length}", file=out, flush=True)

    if out is not None:
        files = ", ".join(p.name for p in loaded.files)
        print(
            f"{cfg.algorithm.name} on {cfg.env.id}, {loaded.checkpoint} checkpoint ({files}): "
            f"{episodes} episode(s)",
            file=out,
        )
    try:
        returns, lengths = play_episodes(
            env, greedy_policy(loaded.algo, bool(cfg.model.lstm)), episodes, seed, on_episode=report
        )
    except gymnasium.error.DependencyNotInstalled as err:  # rendering for --video
        raise EasyRLError(f"{cfg.env.id} needs a package that is not installed: {err}") from err
    finally:
        env.close()
    result = RolloutResult(returns, lengths, loaded.checkpoint)
    if out is not None:
        print(
            f"mean return {result.mean:.1f} over {episodes} episode(s) "
            f"(std {np.std(result.returns):.1f}, mean length {np.mean(result.lengths):.1f})",
            file=out,
        )
        if video_dir is not None:
            print(f"videos in {Path(video_dir).resolve()}", file=out)
    return result
