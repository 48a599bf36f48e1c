"""The Python API: `easyrl.train(config_or_path, **overrides)` runs a whole local cluster.

    import easyrl

    result = easyrl.train("configs/cartpole_ppo.yaml", stop={"max_seconds": 60}, run={"seed": 1})
    print(result.reached_goal, result.metrics["env_steps"], result.run_dir)

Overrides are keyword arguments named after config sections, each a mapping merged into that
section key by key (nested mappings merge too; any other value replaces the file's):
`stop={"max_seconds": 30}` is `--set stop.max_seconds=30` on the command line. `set=[...]`
takes such `dotted.key=value` strings as they are (the `easyrl train` command passes its
`--set` options that way, so both run this same function). Every override goes through the
strict loader: an unknown key raises ConfigError naming the closest valid one.

Custom code named in a config (`env.id: my_envs:MyEnv`, `model.kind: my_nets:MyTorso`,
`algorithm.name: my_pkg.my_algo`) is imported from the Python path, to which `train` adds the
config file's directory and the current directory; the launcher passes its import path on to
every role process it starts.
"""

import json
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from easyrl import config as config_lib
from easyrl.errors import ConfigError, EasyRLError
from easyrl.imports import add_import_roots

__all__ = ["TrainResult", "load", "train"]

_YAML_DOCUMENT_END = "...\n"
"""What `yaml.safe_dump` appends to a lone scalar."""


@dataclass(frozen=True)
class TrainResult:
    """What a finished `train` call reports."""

    run_dir: Path
    """The run directory (config.yaml, metrics.jsonl, summary.json, checkpoints, logs)."""
    exit_code: int
    """0: the goal was reached (or a budget stop when the config sets no return target); 1:
    the run stopped otherwise or failed; 130: interrupted. `easyrl train` exits with it."""
    reached_goal: bool
    """Whether the run stopped for a reason that counts as success (exit_code == 0)."""
    reason: str
    """Why the run stopped, e.g. "target reached: mean return 451.2 >= 450"."""
    elapsed_s: float
    """Wall-clock seconds the run took."""
    metrics: dict[str, Any]
    """The last record of metrics.jsonl (env_steps, updates, episodes, return_mean,
    eval_return_mean when an evaluator ran, ...); empty when none was written."""
    summary: dict[str, Any]
    """summary.json: reason, exit code, restarts per process and the servers' last status."""


def train(
    config_or_path: str | Path | Mapping[str, Any] | config_lib.Config,
    *,
    out: TextIO | None = None,
    set: Sequence[str] = (),  # shadows the builtin here, to mirror the command line's --set
    **overrides: Any,
) -> TrainResult:
    """Trains with every role as a local process until the config's stop condition.

    Call it from the main thread: while it runs, SIGTERM (like Ctrl-C) shuts the run down
    cleanly; the previous SIGTERM handler is restored afterwards.

    Args:
        config_or_path: a YAML config file, a raw config mapping (as YAML loads it), or a
            loaded `easyrl.config.Config`.
        out: where the progress lines go (default: sys.stdout).
        set: `dotted.key=value` overrides, as `--set` takes them; applied first.
        **overrides: config sections as mappings merged into the config, e.g.
            `stop={"max_seconds": 30}`, `algorithm={"lr": 1e-3}`, `run={"dir": "runs/x"}`.

    Returns:
        The run's TrainResult.

    Raises:
        ConfigError: the config or an override is invalid (unknown key, wrong type, a custom
            env module, torso or algorithm that cannot be imported, ...); nothing started.
        EasyRLError: called from another thread than the main one.
    """
    from easyrl.cluster import launcher

    if threading.current_thread() is not threading.main_thread():
        raise EasyRLError("easyrl.train must be called from the main thread (it handles signals)")
    cfg = load(config_or_path, set=set, **overrides)
    run_dir = Path(cfg.run.dir or launcher.default_run_dir(cfg)).resolve()
    cfg = replace(cfg, run=replace(cfg.run, dir=str(run_dir)))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        exit_code = launcher.train(cfg, sys.stdout if out is None else out)
    finally:
        signal.signal(signal.SIGTERM, previous)  # the launcher made SIGTERM act as Ctrl-C
    summary = json.loads((run_dir / "summary.json").read_text())
    return TrainResult(
        run_dir=run_dir,
        exit_code=exit_code,
        reached_goal=exit_code == 0,  # the launcher exits 0 exactly when the goal was reached
        reason=summary["reason"] or "",
        elapsed_s=summary["elapsed_s"],
        metrics=_last_record(run_dir / "metrics.jsonl"),
        summary=summary,
    )


def load(
    config_or_path: str | Path | Mapping[str, Any] | config_lib.Config,
    *,
    set: Sequence[str] = (),
    **overrides: Any,
) -> config_lib.Config:
    """The Config `train` runs for the same arguments (see there), loaded strictly.

    A config file's directory and the current directory are appended to `sys.path` first,
    so that the custom modules the config names can sit next to it.

    Raises:
        ConfigError: see `train`.
    """
    if isinstance(set, str):
        raise ConfigError(f"set: expected a list of dotted.key=value strings, got {set!r}")
    strings = [*set, *_override_strings(overrides, "")]
    if isinstance(config_or_path, str | Path):
        add_import_roots(Path(config_or_path).resolve().parent)
    add_import_roots(Path.cwd())
    if isinstance(config_or_path, str | Path):
        return config_lib.load(config_or_path, strings)
    if isinstance(config_or_path, config_lib.Config):
        config_or_path = config_lib.to_dict(config_or_path)
    if not isinstance(config_or_path, Mapping):
        raise ConfigError(
            "expected a config file path, a config mapping or a Config, got "
            f"{type(config_or_path).__name__}"
        )
    return config_lib.from_dict(config_or_path, strings)


def _override_strings(overrides: Mapping[str, Any], prefix: str) -> list[str]:
    """`dotted.key=value` strings (values in YAML) for every leaf of nested `overrides`.

    Raises:
        ConfigError: a value YAML cannot represent (e.g. a numpy scalar or an object).
    """
    strings = []
    for key, value in overrides.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            strings += _override_strings(value, dotted)
            continue
        try:
            text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000_000)
        except yaml.YAMLError as err:
            raise ConfigError(
                f"{dotted}: {type(value).__name__} {value!r} is not a plain config value "
                "(use str, int, float, bool, None, lists and mappings)"
            ) from err
        strings.append(f"{dotted}={text.removesuffix(_YAML_DOCUMENT_END).strip()}")
    return strings


def _last_record(path: Path) -> dict[str, Any]:
    """The last complete JSON line of `path`, or {} when there is none."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a killed writer
    return {}
