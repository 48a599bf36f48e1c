"""A run directory's policy, rebuilt without any server: the run's `config.yaml` (the resolved
config) gives the algorithm, the model and the environment, and `checkpoints/` holds the weights,
either

- `best.npz`, the evaluator's best weights so far (`var/<name>` arrays and `meta`), or
- `ps-<i>.npz`, one per PS shard, each with the `var/<name>` arrays of ITS variables (plus
  optimizer slots and `meta`): the union of every shard's variables is the latest model.

`load_policy` rebuilds the algorithm and assigns a checkpoint's weights by name; `easyrl.load`
(`easyrl.policy`), `easyrl rollout` and `easyrl export` all load a run through it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.envs import env_options, env_spaces
from easyrl.errors import EasyRLError
from easyrl.imports import add_import_roots
from easyrl.tfimport import import_tensorflow_quietly

__all__ = ["CHECKPOINTS", "LoadedPolicy", "checkpoint_values", "load_policy", "run_config"]

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


def _assign(variables: Mapping, values: dict[str, np.ndarray], files: list[Path], cfg) -> None:
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
    cfg = run_config(run_dir)
    if cfg.multiagent.enabled:
        from easyrl.algorithms.multiagent import NO_GREEDY

        raise EasyRLError(f"{run_dir}: {NO_GREEDY}")
    chosen, files, values = checkpoint_values(run_dir, checkpoint)
    obs_space, action_space = env_spaces(cfg.env.id, **env_options(cfg.env))
    import_tensorflow_quietly()  # once the run directory is known good
    import tensorflow as tf

    spec = registry.spec(cfg.algorithm.name)  # the spec is the only door: no module.build
    with tf.device("/CPU:0"):
        algo = spec.make(cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed)
        _assign(algo.variables, values, files, cfg)
    return LoadedPolicy(cfg, algo, obs_space, action_space, chosen, files)
