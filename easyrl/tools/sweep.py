"""`easyrl sweep`: a grid of settings x seeds, each trial a normal `easyrl train` run.

    easyrl sweep configs/cartpole_ppo.yaml --grid algorithm.lr=0.0003,0.001 --seeds 2

runs the cross product of the grid's values and seeds 0..N-1 (`run.seed`), `--parallel K`
trials at a time, each in its own run directory under the sweep directory (default
`runs/<run.name>-sweep-<hash of the command>`, so that the same command finds it again).
The machine's cores are split between the K trials (each trial's processes are pinned to
its share, and TensorFlow's thread pools sized to it). A re-run of the same command skips
the finished trials and resumes interrupted ones (`easyrl train --resume`). At the end it
writes `sweep.csv` (one row per trial), `sweep.png` (every trial's curve) and prints, per
setting, the final return and the time to the target (`stop.episode_return_mean`) as mean
and spread over the seeds.

`--early-stop median` stops a hopeless trial: once it has trained `--grace-s` seconds, if
the best mean return it has reached is below the median of what the finished trials had
reached by the same time (at least two of them), it is interrupted and counted as stopped
early (a re-run leaves it so).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from easyrl import config as config_lib
from easyrl.cluster.launcher import start_env
from easyrl.errors import ConfigError, EasyRLError
from easyrl.tools.plot import Curves, plot, read_curves

STOPPED_EARLY = "stopped_early"
"""The marker file a trial stopped by `--early-stop` gets in its run directory."""
POLL_S = 1.0


@dataclass(frozen=True)
class Trial:
    """One run of the sweep: a setting of the grid's keys and a seed."""

    name: str
    setting: tuple[tuple[str, str], ...]
    seed: int

    @property
    def settings(self) -> list[str]:
        """The `--set` overrides that make this trial: its setting and its seed."""
        return [f"{k}={v}" for k, v in self.setting] + [f"run.seed={self.seed}"]

    def overrides(self, run_dir: Path) -> list[str]:
        """The `--set` overrides of this trial run in `run_dir` (after the sweep's own)."""
        return [*self.settings, f"run.dir={run_dir}"]

    @property
    def label(self) -> str:
        """The setting without the seed, e.g. `lr=0.001`."""
        return self.name.rsplit(",seed=", 1)[0]


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`KEY=V1,V2,...` items as [(key, values)].

    Raises:
        ConfigError: an item without `=` or values, or a key given twice.
    """
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not options:
            raise ConfigError(
                f"--grid {item!r}: expected KEY=V1,V2,... (e.g. algorithm.lr=1e-3,3e-4)"
            )
        if key in dict(grid):
            raise ConfigError(f"--grid: {key} is given twice")
        grid.append((key, options))
    if not grid:
        raise ConfigError("sweep needs at least one --grid KEY=V1,V2,...")
    return grid


def make_trials(grid: list[tuple[str, list[str]]], seeds: int) -> list[Trial]:
    """The cross product of the grid's values and seeds 0..seeds-1, in order."""
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    # A key's last component names it in the trial's name unless two keys share it.
    lasts = [key.rsplit(".", 1)[-1] for key, _ in grid]
    names = [last if lasts.count(last) == 1 else key for (key, _), last in zip(grid, lasts)]
    trials = []
    for values in itertools.product(*(options for _, options in grid)):
        for seed in range(seeds):
            parts = [f"{n}={v}" for n, v in zip(names, values)] + [f"seed={seed}"]
            name = re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(parts))
            setting = tuple((key, value) for (key, _), value in zip(grid, values))
            trials.append(Trial(name, setting, seed))
    return trials


def default_dir(cfg: config_lib.Config, command: dict) -> Path:
    """runs/<run.name>-sweep-<8 hex digits of the command>: the same command, the same dir."""
    digest = hashlib.sha256(json.dumps(command, sort_keys=True).encode()).hexdigest()[:8]
    return Path("runs") / f"{cfg.run.name}-sweep-{digest}"


def status(run_dir: Path) -> str:
    """A trial's state from its run directory: new, partial (interrupted: resume it),
    stopped early, reached (its target), budget (a stop condition other than the target),
    or failed."""
    if (run_dir / STOPPED_EARLY).exists():
        return "stopped early"
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return "partial" if (run_dir / "config.yaml").is_file() else "new"
    done = json.loads(summary.read_text())
    if done["exit_code"] == 130:
        return "partial"
    if done["exit_code"] == 0:
        return "reached"
    return "budget" if done.get("stop_condition") else "failed"


def _curves(run_dir: Path) -> Curves | None:
    try:
        return read_curves(run_dir)
    except EasyRLError:  # no metrics (yet): a trial that failed at start, or is starting
        return None


def _best_by(curves: Curves | None, time_s: float) -> float | None:
    """The best mean return a run had reached by `time_s` (None: none yet)."""
    if curves is None:
        return None
    reached = [r for t, r in zip(curves.time_s, curves.returns) if t <= time_s]
    return max(reached) if reached else None


def hopeless(curves: Curves | None, finished: list[Curves | None], grace_s: float) -> bool:
    """The median stopping rule (see the module docstring)."""
    if curves is None or not curves.time_s or curves.time_s[-1] < grace_s:
        return False
    now = curves.time_s[-1]
    others = [b for b in (_best_by(c, now) for c in finished) if b is not None]
    mine = _best_by(curves, now)
    return len(others) >= 2 and mine is not None and mine < statistics.median(others)


def _core_shares(parallel: int) -> list[list[int]]:
    """The machine's cores split into `parallel` shares (shared round-robin when fewer)."""
    cores = sorted(os.sched_getaffinity(0))
    if parallel >= len(cores):
        return [[cores[i % len(cores)]] for i in range(parallel)]
    size = len(cores) // parallel
    return [
        cores[i * size : (i + 1) * size] if i < parallel - 1 else cores[i * size :]
        for i in range(parallel)
    ]


class _Running:
    """One trial's `easyrl train` process, pinned to its share of the cores."""

    def __init__(self, trial: Trial, command: list[str], cores: list[int], log: Path):
        self.trial, self.cores = trial, cores
        env = {**os.environ, **start_env(cores)}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["TF_NUM_INTRAOP_THREADS"] = env["TF_NUM_INTEROP_THREADS"] = str(len(cores))
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the sweep, which passes it on
            )


def _row(trial: Trial, run_dir: Path, target: float | None) -> dict:
    state = status(run_dir)
    summary = run_dir / "summary.json"
    done = json.loads(summary.read_text()) if summary.is_file() else {}
    curves = _curves(run_dir)
    returns = curves.returns if curves else []
    reach = None
    if curves is not None and target is not None:
        reach = next((t for t, r in zip(curves.time_s, curves.returns) if r >= target), None)
    return {
        "trial": trial.name,
        **dict(trial.setting),
        "seed": trial.seed,
        "status": state,
        "exit_code": done.get("exit_code", ""),
        "elapsed_s": done.get("elapsed_s", ""),
        "env_steps": curves.env_steps[-1] if curves else "",
        "final_return": returns[-1] if returns else "",
        "best_return": max(returns) if returns else "",
        "time_to_target_s": "" if reach is None else reach,
    }


def _spread(values: list[float], unit: str = "") -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f}{unit} +- {spread:.1f}{unit}"


def summarize(rows: list[dict], trials: list[Trial], target: float | None, out: TextIO) -> None:
    """Prints one line per setting: final return and time to target over its seeds."""
    by_label: dict[str, list[dict]] = {}
    for trial, row in zip(trials, rows):
        by_label.setdefault(trial.label, []).append(row)
    width = max(len(label) for label in by_label)
    for label, group in by_label.items():
        finals = [r["final_return"] for r in group if r["final_return"] != ""]
        times = [r["time_to_target_s"] for r in group if r["time_to_target_s"] != ""]
        line = f"{label:<{width}}  {len(group)} seed(s)  final return {_spread(finals)}"
        if target is not None:
            line += f"  | reached {target:g} in {len(times)}/{len(group)}: {_spread(times, ' s')}"
        stopped = sum(r["status"] == "stopped early" for r in group)
        failed = sum(r["status"] == "failed" for r in group)
        line += f"  ({stopped} stopped early)" * bool(stopped) + f"  ({failed} FAILED)" * bool(
            failed
        )
        print(line, file=out)


def sweep(
    config: str | Path,
    grid_items: Sequence[str],
    *,
    seeds: int = 1,
    parallel: int = 1,
    sets: Sequence[str] = (),
    directory: str | Path | None = None,
    early_stop: str | None = None,
    grace_s: float = 30.0,
    out: TextIO = sys.stdout,
) -> int:
    """Runs a sweep (see the module docstring); returns the exit code: 0 when every trial
    finished (reached its target, ran out its budget or was stopped early), 1 when one
    failed, 130 when interrupted (a re-run goes on).

    Raises:
        ConfigError: a bad grid, seed count or parallelism, a trial config that does not load
            (nothing started), or a sweep directory holding another sweep.
    """
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {parallel}")
    if early_stop not in (None, "median"):
        raise ConfigError(f"--early-stop {early_stop!r}: the one rule is 'median'")
    grid = parse_grid(grid_items)
    trials = make_trials(grid, seeds)
    config = Path(config).resolve()
    command = {"config": str(config), "grid": grid, "seeds": seeds, "set": list(sets)}
    base = config_lib.load(config, sets)
    root = Path(directory) if directory else default_dir(base, command)
    root = root.resolve()
    for trial in trials:  # every trial's config must load before anything starts
        config_lib.load(config, [*sets, *trial.overrides(root / trial.name)])
    saved = root / "sweep.json"
    if saved.is_file() and json.loads(saved.read_text()) != json.loads(json.dumps(command)):
        raise ConfigError(f"{root} holds another sweep ({saved}); give another --dir")
    root.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(command, indent=2) + "\n")
    target = base.stop.episode_return_mean
    print(
        f"sweep directory: {root} ({len(trials)} trials, {parallel} at a time)",
        file=out,
        flush=True,
    )

    pending = []
    for trial in trials:
        state = status(root / trial.name)
        if state in ("new", "partial"):
            pending.append(trial)
        else:
            print(f"  {trial.name}: {state} earlier; skipped", file=out, flush=True)
    free, running = _core_shares(parallel), []
    interrupted = False
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:  # both stop the sweep like Ctrl-C (as `easyrl train`'s launcher)
        signal.signal(signum, signal.default_int_handler)
    try:
        while pending or running:
            while pending and free:
                trial = pending.pop(0)
                run_dir = root / trial.name
                train = [sys.executable, "-m", "easyrl.cli", "train"]
                if status(run_dir) == "partial":
                    train += ["--resume", str(run_dir)]
                else:
                    train += [str(config)]
                    for override in [*sets, *trial.overrides(run_dir)]:
                        train += ["--set", override]
                cores = free.pop(0)
                running.append(_Running(trial, train, cores, root / "logs" / f"{trial.name}.out"))
                print(f"  {trial.name}: started on cores {cores}", file=out, flush=True)
            time.sleep(POLL_S)
            finished = [  # read only for the early-stopping rule
                _curves(root / t.name)
                for t in (trials if early_stop else ())
                if status(root / t.name) in ("reached", "budget")
            ]
            for job in list(running):
                run_dir = root / job.trial.name
                if job.process.poll() is None:
                    if early_stop and hopeless(_curves(run_dir), finished, grace_s):
                        (run_dir / STOPPED_EARLY).touch()
                        job.process.send_signal(signal.SIGINT)
                    continue
                running.remove(job)
                free.append(job.cores)
                row = _row(job.trial, run_dir, target)
                final = "-" if row["final_return"] == "" else f"{row['final_return']:.1f}"
                print(
                    f"  {job.trial.name}: {row['status']} (exit {job.process.returncode}), "
                    f"final return {final}",
                    file=out,
                    flush=True,
                )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for job in running:  # each trial checkpoints and writes its summary (a re-run resumes it)
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGINT)
        for job in running:
            job.process.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    rows = [_row(t, root / t.name, target) for t in trials]
    with (root / "sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summarize(rows, trials, target, out)
    drawn: list[str | Path] = [root / t.name for t in trials if _curves(root / t.name) is not None]
    if drawn:
        try:
            image = plot(drawn, root / "sweep.png", title=config.name)
            print(f"wrote {root / 'sweep.csv'} and {image}", file=out)
        except EasyRLError as err:  # matplotlib missing: the table is the result
            print(f"wrote {root / 'sweep.csv'}; no plot: {err}", file=out)
    if interrupted:
        return 130
    return 1 if any(r["status"] in ("failed", "partial", "new") for r in rows) else 0
