"""Run statistics kept by PS shard 0: counters, recent returns, rates, stop condition.

PS shard 0 is the metrics hub of a run: actors and learners `Report` to it; it
writes `metrics.jsonl` and TensorBoard scalars, decides when the `stop:`
condition is met, and answers `Status` with the same numbers.
"""

import collections
import enum
import json
import math
import re
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

STATS_MAX_KEYS = 64
"""Most stats one Report may carry."""
POLICIES_MAX = 64
"""Most policies a run's metrics keep returns of (multi-agent runs)."""
_POLICY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_STAT_KEY = re.compile(r"(?:(\d{1,6})/)?[A-Za-z_][A-Za-z0-9_.]{0,63}")


def check_stats(task: int, stats: dict[str, float]) -> None:
    """Checks the `stats` of a Report from `task` of a role: at most `STATS_MAX_KEYS`,
    finite, each key a name of at most 64 letters, digits, `_` and `.`, optionally under the
    reporter's own task (`<task>/name`), so that no reporter writes another's counters.

    Raises:
        ValueError: the first problem, naming the key (cut to 80 characters).
    """
    if len(stats) > STATS_MAX_KEYS:
        raise ValueError(f"Report: at most {STATS_MAX_KEYS} stats, got {len(stats)}")
    for key, value in stats.items():
        match = _STAT_KEY.fullmatch(key)
        if match is None or (match[1] is not None and int(match[1]) != task):
            raise ValueError(
                f"Report: stat key {key[:80]!r} must be a name of at most 64 letters, digits, "
                f"'_' and '.', optionally under the reporter's own task ('{task}/name')"
            )
        if not math.isfinite(value):
            raise ValueError(f"Report: stat {key!r} must be finite, got {value}")


def check_policies(policies: list[str], episodes: int) -> None:
    """Checks a Report's `episode_policies`: none (a single-agent run) or one policy name
    (as `multiagent.policies` allows) per episode.

    Raises:
        ValueError: the first problem.
    """
    if len(policies) not in (0, episodes):
        raise ValueError("Report: episode_policies must match episode_returns")
    for name in set(policies):
        if not _POLICY.fullmatch(name):
            raise ValueError(f"Report: episode policy {name[:80]!r} is not a policy name")


class RunStats:
    """Thread-safe counters of a run (env steps, updates, episodes, recent returns).

    Args:
        window: how many recent episode returns the mean is taken over.
    """

    def __init__(self, window: int = 100):
        if window < 1:
            raise ValueError("window must be >= 1")
        self._lock = threading.Lock()
        self.window = window
        self._returns = collections.deque(maxlen=window)
        self._lengths = collections.deque(maxlen=window)
        # Multi-agent runs: {policy: recent (return, length) of its agents' episodes}.
        self._policies: dict[str, collections.deque] = {}
        totals = {"env_steps": 0.0, "updates": 0.0, "episodes": 0.0}
        self._counters: dict[str, float] = collections.defaultdict(float, totals)
        self._stats: dict[str, float] = {}
        self._last = (time.monotonic(), 0.0, 0.0)
        self._eval: dict[str, float] = {}
        self._rates = {"env_steps_per_s": 0.0, "updates_per_s": 0.0}

    def report(
        self, role, task, env_steps, updates, returns, lengths, stats, evals=(), policies=()
    ) -> None:
        """Adds one report from `role` `task` (deltas since its previous report); `evals`
        are the returns of one evaluation (the evaluator's report); `policies` the policy of
        each episode of a multi-agent run (the first `POLICIES_MAX` policies are kept)."""
        with self._lock:
            if len(evals):
                mean = float(np.mean(evals))
                self._eval = {
                    "eval_return_mean": mean,
                    "eval_episodes": float(len(evals)),
                    "eval_at_env_steps": self._counters["env_steps"],
                    "eval_count": self._eval.get("eval_count", 0.0) + 1,
                    "eval_return_best": max(mean, self._eval.get("eval_return_best", -np.inf)),
                }
            for prefix in ("", f"{role}/{task}/"):  # the run's totals and the reporter's own
                self._counters[f"{prefix}env_steps"] += env_steps
                self._counters[f"{prefix}updates"] += updates
                self._counters[f"{prefix}episodes"] += len(returns)
            self._returns.extend(returns)
            self._lengths.extend(lengths)
            for policy, ret, length in zip(policies, returns, lengths, strict=False):
                if policy not in self._policies and len(self._policies) >= POLICIES_MAX:
                    continue
                recent = self._policies.setdefault(policy, collections.deque(maxlen=self.window))
                recent.append((ret, length))
                self._counters[f"policy/{policy}/episodes"] += 1
            for key, value in stats.items():
                self._stats[f"{role}/{key}"] = float(value)

    def snapshot(self, update_rates: bool = False) -> dict[str, float]:
        """Returns every counter, the recent-return mean and the throughput rates.

        Args:
            update_rates: recompute env steps/s and updates/s since the previous call
                that recomputed them (the metrics thread's job).
        """
        with self._lock:
            out = {**self._stats, **self._counters}  # a stat never hides a counter
            now = time.monotonic()
            if update_rates:
                t0, steps0, updates0 = self._last
                dt = max(now - t0, 1e-9)
                self._rates = {
                    "env_steps_per_s": (out.get("env_steps", 0.0) - steps0) / dt,
                    "updates_per_s": (out.get("updates", 0.0) - updates0) / dt,
                }
                self._last = (now, out.get("env_steps", 0.0), out.get("updates", 0.0))
            out.update(self._rates)
            out.update(self._eval)
            out["recent_episodes"] = float(len(self._returns))
            if self._returns:
                out["return_mean"] = float(np.mean(self._returns))
                out["return_max"] = float(np.max(self._returns))
                out["length_mean"] = float(np.mean(self._lengths)) if self._lengths else 0.0
            for policy, recent in self._policies.items():  # [E, 2] (return, length)
                out[f"policy/{policy}/return_mean"] = float(np.mean([r for r, _ in recent]))
                out[f"policy/{policy}/length_mean"] = float(np.mean([n for _, n in recent]))
            return out

    def recent_returns(self) -> list[float]:
        """The last `window` episode returns."""
        with self._lock:
            return list(self._returns)

    def state(self) -> dict:
        """Counters and recent returns as plain data, for checkpoints."""
        with self._lock:
            return {
                "counters": dict(self._counters),
                "returns": list(self._returns),
                "eval": dict(self._eval),
            }

    def load_state(self, state: dict) -> None:
        """Restores what `state` returned."""
        with self._lock:
            self._counters.update(state.get("counters", {}))
            self._returns.extend(state.get("returns", []))
            self._eval.update(state.get("eval", {}))
            self._last = (time.monotonic(), self._counters["env_steps"], self._counters["updates"])


def recorded_steps(counters: dict) -> float:
    """Steps written to disk by all actors (`output:`), from PS shard 0's counters (each
    actor reports its own as `actor/<task>/recorded_steps`)."""
    return sum(
        v for k, v in counters.items() if k.startswith("actor/") and k.endswith("/recorded_steps")
    )


class StopKind(enum.Enum):
    """The stop condition that ended a run (PS shard 0's), by the config key that set it;
    on the wire, `StopKind` with the same names prefixed `STOP_`."""

    OUTPUT_MAX_STEPS = "output.max_steps"
    EVAL_TARGET = "stop.eval_return_mean"
    TARGET = "stop.episode_return_mean"
    MAX_ENV_STEPS = "stop.max_env_steps"
    MAX_SECONDS = "stop.max_seconds"


class Stop(NamedTuple):
    """Why a run stops: the condition (what success is judged from) and a line for people."""

    kind: StopKind
    text: str


def stop_reason(stop, snapshot: dict[str, float], elapsed_s: float, output=None) -> Stop | None:
    """Returns why the run should stop now, or None.

    Args:
        stop: the config's `stop` section.
        snapshot: a `RunStats.snapshot()`.
        elapsed_s: seconds since the run started.
        output: the config's `output` section (a recording run ends once the actors wrote
            `output.max_steps` steps), or None.
    """
    if output is not None and output.max_steps is not None:
        if recorded_steps(snapshot) >= output.max_steps:
            return Stop(
                StopKind.OUTPUT_MAX_STEPS,
                f"output.max_steps reached: {output.max_steps} steps recorded",
            )
    target = stop.eval_return_mean
    if target is not None and snapshot.get("eval_return_mean", -np.inf) >= target:
        mean, episodes = snapshot["eval_return_mean"], int(snapshot["eval_episodes"])
        text = f"target reached: evaluation return {mean:.1f} >= {target:g} ({episodes} episodes)"
        return Stop(StopKind.EVAL_TARGET, text)
    target = stop.episode_return_mean
    if (
        target is not None
        and snapshot.get("recent_episodes", 0) >= stop.window
        and snapshot.get("return_mean", -np.inf) >= target
    ):
        return Stop(
            StopKind.TARGET,
            f"target reached: mean return {snapshot['return_mean']:.1f} >= {target:g}",
        )
    if stop.max_env_steps is not None and snapshot.get("env_steps", 0) >= stop.max_env_steps:
        # The PS counts env steps as the actors' reports arrive, so a run ends up to one
        # report per actor past the limit.
        text = (
            f"max_env_steps {stop.max_env_steps:,} reached at {int(snapshot['env_steps']):,} "
            "(counters arrive in actor reports)"
        )
        return Stop(StopKind.MAX_ENV_STEPS, text)
    if stop.max_seconds is not None and elapsed_s >= stop.max_seconds:
        return Stop(StopKind.MAX_SECONDS, f"max_seconds reached: {elapsed_s:.0f} s")
    return None


def reached_goal(stop, kind: StopKind | None, output=None) -> bool:
    """Whether a run that stopped on `kind` succeeded: all `output.max_steps` steps recorded
    in a recording run, else a return target when one is set, otherwise a budget stop
    (`stop.max_env_steps` or `stop.max_seconds`). None (no stop condition met) never is."""
    if output is not None and output.max_steps is not None:
        return kind is StopKind.OUTPUT_MAX_STEPS
    if stop.episode_return_mean is not None or stop.eval_return_mean is not None:
        return kind in (StopKind.TARGET, StopKind.EVAL_TARGET)
    return kind in (StopKind.MAX_ENV_STEPS, StopKind.MAX_SECONDS)


def progress_line(elapsed: float, counters: dict, restarts: int | None = None) -> str:
    """One human-readable progress line (what `easyrl train` prints and PS shard 0 logs);
    `restarts` only where they are known (the launcher)."""
    ret = counters.get("return_mean")
    ret_text = f"{ret:7.1f} ({int(counters.get('recent_episodes', 0))} ep)" if ret else "    -"
    return (
        f"[{elapsed:6.1f}s] env steps {int(counters.get('env_steps', 0)):>9,} "
        f"({counters.get('env_steps_per_s', 0):7,.0f}/s) | updates "
        f"{int(counters.get('updates', 0)):>7,} ({counters.get('updates_per_s', 0):5,.0f}/s) | "
        f"episodes {int(counters.get('episodes', 0)):>6,} | return {ret_text} | "
        + (f"eval {counters['eval_return_mean']:7.1f} | " if "eval_return_mean" in counters else "")
        + ("" if restarts is None else f"restarts {restarts}")
    ).rstrip(" |")


class MetricsWriter:
    """Appends snapshots to `metrics.jsonl` and TensorBoard scalars under `run_dir/tb`."""

    def __init__(self, run_dir: str | Path):
        import tensorflow as tf

        self._tf = tf
        self._path = Path(run_dir) / "metrics.jsonl"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = tf.summary.create_file_writer(str(Path(run_dir) / "tb"))

    def write(self, snapshot: dict[str, float], elapsed_s: float, stop: str | None) -> None:
        """Writes one snapshot (step = env steps)."""
        record: dict[str, float | str] = {"time_s": round(elapsed_s, 3), **snapshot}
        if stop:
            record["stop"] = stop
        # Strict JSON: a non-finite value (none is expected) is written as null.
        strict = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in record.items()
        }
        with self._path.open("a") as f:
            f.write(json.dumps(strict, allow_nan=False) + "\n")
        step = int(snapshot.get("env_steps", 0))
        with self._tb.as_default(step=step):
            self._tf.summary.scalar("time_s", elapsed_s)  # the run clock, as in metrics.jsonl
            for key, value in snapshot.items():
                self._tf.summary.scalar(key, value)
        self._tb.flush()
