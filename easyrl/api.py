"""The Python API: `easyrl.train(config_or_path, **overrides)` runs a whole local cluster.

    import easyrl

    result = easyrl.train("configs/cartpole_ppo.yaml", stop={"max_seconds": 60}, run={"seed": 1})
    print(result.reached_goal, result.metrics["env_steps"], result.run_dir)
    policy = easyrl.load(result.run_dir)  # see easyrl.policy
    action, _ = policy.predict(obs)

`callbacks=[...]` takes `easyrl.Callback` instances (see `easyrl.callbacks`): hooks on each
metrics row, evaluation, checkpoint and the stop, any of which may stop the run.

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
import logging
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from easyrl import config as config_lib
from easyrl.callbacks import Callback, CallbackRunner
from easyrl.cluster import rundir
from easyrl.errors import ConfigError, EasyRLError
from easyrl.imports import add_import_roots
from easyrl.tfimport import import_tensorflow_quietly

__all__ = ["TrainResult", "load_config", "train"]

log = logging.getLogger(__name__)

_YAML_DOCUMENT_END = "...\n"
"""What `yaml.safe_dump` appends to a lone scalar."""


@dataclass(frozen=True)
class TrainResult:
    """What a finished `train` call reports."""

    run_dir: Path
    """The run directory (config.yaml, metrics.jsonl, summary.json, checkpoints, logs)."""
    exit_code: int
    """0: the goal was reached (or a budget stop when the config sets no return target); 1:
    the run stopped otherwise (a callback stopped it too) or failed; 130: interrupted.
    `easyrl train` exits with it."""
    reached_goal: bool
    """Whether the run stopped for a reason that counts as success (exit_code == 0)."""
    reason: str
    """Why the run stopped, e.g. "target reached: mean return 451.2 >= 450"."""
    elapsed_s: float
    """Seconds of training on the run clock of PS shard 0, as its last checkpoint holds it
    (counted across resumes; what metrics.jsonl's time_s and stop.max_seconds read)."""
    metrics: dict[str, Any]
    """The last record of metrics.jsonl (env_steps, updates, episodes, return_mean,
    eval_return_mean when an evaluator ran, ...); empty when none was written."""
    summary: dict[str, Any]
    """summary.json: reason, exit code, restarts per process and the servers' last status."""


def train(
    config_or_path: str | Path | Mapping[str, Any] | config_lib.Config | None = None,
    *,
    resume: str | Path | None = None,
    out: TextIO | None = None,
    set: Sequence[str] = (),  # shadows the builtin here, to mirror the command line's --set
    callbacks: Sequence[Callback] = (),
    **overrides: Any,
) -> TrainResult:
    """Trains with every role as a local process until the config's stop condition.

    Call it from the main thread: while it runs, SIGTERM (like Ctrl-C) shuts the run down
    cleanly, and so does SIGINT; the previous handlers are restored afterwards.

    A new run never starts in a directory that holds another run (`run.dir`); a run is
    resumed explicitly with `resume=RUN_DIR`, which restores its counters, weights, optimizer
    state, replay and run clock from its checkpoints and trains on under its own config.

    Args:
        config_or_path: a YAML config file, a raw config mapping (as YAML loads it), or a
            loaded `easyrl.config.Config`; None when resuming.
        resume: the directory of a run to resume (`easyrl train --resume RUN_DIR`).
        out: where the progress lines go (default: sys.stdout).
        set: `dotted.key=value` overrides, as `--set` takes them; applied first. A resumed
            run takes only those of stop conditions, logging and intervals
            (`easyrl.cluster.rundir.RESUMABLE`) and of the algorithm's real-valued
            hyper-parameters; they hold for later resumes too.
        callbacks: `easyrl.Callback` instances whose hooks the launcher calls on each
            metrics row, evaluation and checkpoint and at the stop; one that returns False
            (or calls its `stop(reason)`) stops the run cleanly, whose reason is then
            "stopped by callback NAME: REASON" (exit code 1). See `easyrl.callbacks`.
        **overrides: config sections as mappings merged into the config, e.g.
            `stop={"max_seconds": 30}`, `algorithm={"lr": 1e-3}`, `run={"dir": "runs/x"}`.

    Returns:
        The run's TrainResult.

    Raises:
        ConfigError: the config or an override is invalid (unknown key, wrong type, a custom
            env module, torso or algorithm that cannot be imported, an env id that does not
            exist, a model that does not fit the env, ...), `run.dir` holds another run, or
            `resume` names no run; nothing started and no file was written.
        EasyRLError: called from another thread than the main one, or a callback that is
            not an `easyrl.Callback`.
        Exception: what a callback raised, after the run it stopped has shut down.
    """
    from easyrl.cluster import launcher

    if threading.current_thread() is not threading.main_thread():
        raise EasyRLError("easyrl.train must be called from the main thread (it handles signals)")
    out = sys.stdout if out is None else out
    if resume is None:
        if config_or_path is None:
            raise ConfigError("train: give a config (file, mapping or Config) or resume=RUN_DIR")
        cfg = load_config(config_or_path, set=set, **overrides)
        run_dir = Path(cfg.run.dir or launcher.default_run_dir(cfg)).resolve()
        cfg = replace(cfg, run=replace(cfg.run, dir=str(run_dir)))
        rundir.check_fresh(cfg, run_dir)
    else:
        if config_or_path is not None or overrides:
            raise ConfigError("resume: the run's own config.yaml is its config; give no other")
        add_import_roots(Path.cwd())
        run_dir = Path(resume).resolve()
        cfg = rundir.load_resumed(run_dir, set)
        state = rundir.resume_state(run_dir)
        rundir.check_budget_left(cfg, state)  # before check_builds imports TensorFlow
    runner = CallbackRunner(callbacks, run_dir, resumed=resume is not None) if callbacks else None
    check_builds(cfg)
    if resume is not None:
        print(rundir.describe_resume(run_dir, cfg, state, set), file=out, flush=True)
        rundir.record_resume(run_dir, set, state["elapsed_s"])
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        exit_code = launcher.train(cfg, out, resumed=resume is not None, callbacks=runner)
    finally:
        for signum, handler in previous.items():  # the launcher made both act as Ctrl-C
            signal.signal(signum, handler)
    if runner is not None and runner.error is not None:
        raise runner.error
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


def load_config(
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


def check_builds(cfg: config_lib.Config) -> None:
    """Builds the env once and the algorithm's networks on it (on the CPU), so that a wrong
    env id, `module:Class` path, space/model mismatch or missing extra fails before any role
    process starts or any file is written.

    Raises:
        ConfigError: what the env or the model building raised, naming the key.
    """
    from easyrl.algorithms import registry
    from easyrl.envs.multiagent import run_spaces

    obs_space, action_space = run_spaces(cfg)  # before TF: fast
    registry.check_spaces(cfg.algorithm.name, cfg.env.id, obs_space)
    if cfg.env.vector == "envpool":
        from easyrl.envs import env_options
        from easyrl.envs.pool import pool_task

        pool_task(cfg.env.id, **env_options(cfg.env))
    import_tensorflow_quietly()  # the first TensorFlow import of a launcher or a notebook
    import tensorflow as tf

    try:  # the launcher must not take a GPU's memory from the learners
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # this process set up its devices already (a notebook): keep them
        log.debug("TensorFlow's devices are set up already; building on /CPU:0 anyway")
    with tf.device("/CPU:0"):
        spec = registry.spec(cfg.algorithm.name)
        if cfg.multiagent.enabled:
            from easyrl.algorithms import multiagent

            multiagent.build(cfg, spec, obs_space, action_space)
        else:
            spec.make(cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed)


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
