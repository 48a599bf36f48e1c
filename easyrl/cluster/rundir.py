"""A run directory belongs to one run: a new run never starts in a directory that holds
another, and resuming one is explicit (`easyrl train --resume RUN_DIR`).

A directory holds a run when it has a `config.yaml`. Starting a run there is refused before
anything is written, naming the keys whose values differ (those of `algorithm`, `model`,
`env` and the cluster's shape change what the checkpoints mean). Resuming loads the run's
own `config.yaml` and accepts overrides only of `RESUMABLE` keys (stop conditions, logging,
intervals) and of the algorithm's real-valued hyper-parameters (learning rates, loss weights,
discounts: no checkpoint or replay item depends on them, as annealing by hand needs), which
are recorded in `resumes.yaml` beside it and hold for every later resume too.
"""

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from easyrl import config as config_lib
from easyrl.errors import ConfigError

SHAPING = ("algorithm", "model", "env", "cluster.ps", "cluster.memory", "cluster.learner")
"""Config keys (and prefixes) whose values the run's checkpoints and replay depend on."""
RESUMABLE = ("stop", "run.log_interval_s", "run.checkpoint_interval_s", "eval", "security")
"""Config keys (and prefixes) a resumed run may override."""


def flat(raw: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted key: leaf value}."""
    if not isinstance(raw, dict) or not raw:
        return {prefix: raw}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def check_fresh(cfg: config_lib.Config, run_dir: Path) -> None:
    """Refuses to start run `cfg` in `run_dir` when it holds a run (reads, writes nothing).

    Raises:
        ConfigError: `run_dir` has a config.yaml; the message names the keys whose values
            differ from it (algorithm, model, env, cluster shape) and how to resume instead.
    """
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    try:
        theirs = flat(config_lib.to_dict(config_lib.load(saved)))
    except ConfigError as err:
        raise ConfigError(
            f"run.dir: {run_dir} holds a run whose config.yaml does not load here ({err}); "
            "nothing was changed there: choose another run.dir"
        ) from err
    ours = flat(config_lib.to_dict(cfg))
    differ = sorted(
        k for k in set(theirs) | set(ours) if _under(k, SHAPING) and theirs.get(k) != ours.get(k)
    )
    if "algorithm.name" in differ:  # another algorithm: its parameters differ as a matter of course
        differ = [k for k in differ if k == "algorithm.name" or not k.startswith("algorithm.")]
    changes = [f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in differ[:8]]
    more = f" and {len(differ) - 8} more" if len(differ) > 8 else ""
    what = f"another run ({'; '.join(changes)}{more})" if differ else "a run of this config"
    raise ConfigError(
        f"run.dir: {run_dir} holds {what}. Nothing was changed there; resume it with "
        f"`easyrl train --resume {run_dir}`, or choose another run.dir"
    )


def load_resumed(run_dir: Path, overrides: Sequence[str] = ()) -> config_lib.Config:
    """The config of the run in `run_dir`: its config.yaml, the overrides of every earlier
    resume (`resumes.yaml`, in order) and `overrides` of RESUMABLE keys on top (a later
    value of a key wins).

    Raises:
        ConfigError: no run there, or an override of a key the checkpoints depend on.
    """
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume: {run_dir} holds no run (no config.yaml)")
    params = config_lib.load(saved).algorithm.params
    for override in overrides:
        key = override.partition("=")[0].strip()
        field = key.removeprefix("algorithm.")
        real = field != key and type(getattr(params, field, None)) is float
        if not (real or _under(key, RESUMABLE)):
            raise ConfigError(
                f"--resume: {key} cannot change when resuming (only "
                f"{', '.join(RESUMABLE)} and the algorithm's real-valued hyper-parameters "
                "can); start a new run for that"
            )
    cfg = config_lib.load(saved, [*earlier_overrides(run_dir), *overrides])
    return replace(cfg, run=replace(cfg.run, dir=str(run_dir.resolve())))


def _resumes(run_dir: Path) -> list[dict]:
    """The records of resumes.yaml (none when there is no such file)."""
    path = run_dir / "resumes.yaml"
    return (yaml.safe_load(path.read_text()) or []) if path.is_file() else []


def earlier_overrides(run_dir: Path) -> list[str]:
    """The `--set` overrides of every earlier resume of the run in `run_dir`, in order: they
    hold for every later resume too (until one sets the key again)."""
    return [o for record in _resumes(run_dir) for o in record.get("overrides", [])]


def record_resume(run_dir: Path, overrides: Sequence[str], elapsed_s: float) -> None:
    """Appends this resume (its overrides and the run clock it resumed at) to resumes.yaml."""
    done = _resumes(run_dir)
    done.append({"at_elapsed_s": round(elapsed_s, 2), "overrides": list(overrides)})
    (run_dir / "resumes.yaml").write_text(yaml.safe_dump(done, sort_keys=False))


def stop_conditions(cfg: config_lib.Config) -> str:
    """The stop conditions `cfg` sets, as `key=value` settings ("none: it runs until
    interrupted" when it sets none)."""
    stop = cfg.stop
    conditions = [
        f"stop.{key}={_number(value)}"
        for key in ("episode_return_mean", "eval_return_mean", "max_env_steps", "max_seconds")
        if (value := getattr(stop, key)) is not None
    ]
    if stop.episode_return_mean is not None:
        conditions[0] += f" (over {stop.window} episodes)"
    if cfg.output.max_steps is not None:
        conditions.insert(0, f"output.max_steps={cfg.output.max_steps}")
    return ", ".join(conditions) or "none: it runs until interrupted"


def _number(value: float) -> str:
    """`value` as `--set` would take it: 3600, 0.5, 1000000 (never 1e+06)."""
    return str(value) if isinstance(value, int) else np.format_float_positional(value, trim="-")


def describe_resume(
    run_dir: Path, cfg: config_lib.Config, state: dict[str, float], overrides: Sequence[str]
) -> str:
    """What a resume prints before it starts: what the checkpoints hold (`state`, from
    `resume_state`: the run clock goes on from exactly what PS shard 0 checkpointed), the
    overrides kept from earlier resumes, this resume's, and the stop conditions the resumed
    run heads for."""
    lines = [
        f"resuming {run_dir}: version {state['version']:.0f}, env steps "
        f"{state['env_steps']:,.0f}, replay {state['replay_items']:,.0f} items, run clock "
        f"{state['elapsed_s']:.2f} s"
    ]
    earlier = earlier_overrides(run_dir)
    if earlier:
        lines.append(f"overrides kept from earlier resumes (resumes.yaml): {' '.join(earlier)}")
    if overrides:
        lines.append(f"overrides of this resume: {' '.join(overrides)}")
    lines.append(f"stop conditions (the first met stops the run): {stop_conditions(cfg)}")
    return "\n".join(lines)


def _ps0_meta(run_dir: Path) -> dict | None:
    """The meta record of PS shard 0's checkpoint (version, counters, run clock), or None
    when it has written none."""
    ps0 = run_dir / "checkpoints" / "ps-0.npz"
    if not ps0.is_file():
        return None
    with np.load(ps0) as data:
        return json.loads(bytes(data["meta"]).decode())


def checkpointed_clock(run_dir: Path) -> float | None:
    """The run clock PS shard 0's checkpoint recorded (`elapsed_s`: where a resume goes on
    from), or None when it has written none."""
    meta = _ps0_meta(run_dir)
    return None if meta is None else float(meta.get("elapsed_s", 0.0))


def resume_state(run_dir: Path) -> dict[str, float]:
    """What a run directory's checkpoints hold: PS version, env steps, run clock and replay
    items (0 for what is missing)."""
    state = {"version": 0.0, "env_steps": 0.0, "elapsed_s": 0.0, "replay_items": 0.0}
    checkpoints = run_dir / "checkpoints"
    meta = _ps0_meta(run_dir)
    if meta is not None:
        state["version"] = float(meta.get("version", 0))
        state["elapsed_s"] = float(meta.get("elapsed_s", 0.0))
        counters = meta.get("stats", {}).get("counters", {})
        state["env_steps"] = float(counters.get("env_steps", 0.0))
    for snapshot in sorted(checkpoints.glob("memory-*.npz")):
        with np.load(snapshot) as data:
            if "inserted" in data.files and "capacity" in data.files:
                state["replay_items"] += float(min(data["inserted"], data["capacity"]))
    return state


def check_budget_left(cfg: config_lib.Config, state: dict[str, float]) -> None:
    """Refuses to resume a run whose checkpoints are already past a budget stop condition
    (it would start every process only to stop at once), naming the key to raise.

    Raises:
        ConfigError: `stop.max_seconds` <= the run clock, or `stop.max_env_steps` <= the
            env steps, of the checkpoints.
    """
    for key, limit, done, unit in (
        ("max_seconds", cfg.stop.max_seconds, state["elapsed_s"], "s of run clock"),
        ("max_env_steps", cfg.stop.max_env_steps, state["env_steps"], "env steps"),
    ):
        if limit is not None and done >= limit:
            raise ConfigError(
                f"--resume: the run is at {done:,.0f} {unit}, past stop.{key}={limit:g}: it "
                f"would stop at once; raise it, e.g. --set stop.{key}={2 * done:.0f}"
            )
