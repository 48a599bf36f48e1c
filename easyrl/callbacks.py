"""Callbacks of `easyrl.train`: hooks on progress, evaluations, checkpoints and the stop.

    import easyrl

    class StopAt(easyrl.Callback):
        def on_progress(self, row):
            print(row["env_steps"], row.get("return_mean"))
            if row.get("return_mean", 0) >= 200:
                return self.stop(f"mean return {row['return_mean']:.0f} >= 200")

    result = easyrl.train("configs/cartpole_ppo.yaml", callbacks=[StopAt()])

The hooks run in the process that called `train` (the launcher), between its polls of PS
shard 0 (every 0.5 s), while the role processes train on: a slow hook delays the launcher's
progress lines and stop checks, not the training. A hook asks the run to stop as
Stable-Baselines3's `_on_step` does, by returning False, or by calling `self.stop(reason)`
(which returns False, so `return self.stop(...)` reads well); None and True go on. The run
then stops cleanly (checkpoints written, every process ended) and its `reason` (TrainResult,
summary.json, the last line) is "stopped by callback NAME: REASON". A hook that raises stops
the run the same way, and `train` raises its exception once the run has shut down.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from easyrl.errors import EasyRLError

__all__ = ["Callback", "CallbackRunner"]


class Callback:
    """Base class of `easyrl.train`'s callbacks: every hook does nothing unless overridden.

    Each hook but `on_stop` may return False (or call `stop`) to ask the run to stop.
    """

    stop_reason: str | None = None
    """Why this callback asked the run to stop (`stop`), or None."""

    def on_progress(self, row: dict[str, Any]) -> bool | None:
        """Each metrics row PS shard 0 writes (every `run.log_interval_s`), the dict that
        goes to metrics.jsonl: `time_s` (run clock), `env_steps`, `updates`, `episodes`,
        `return_mean` (once episodes ended), `eval_return_mean` (after an evaluation), ..."""
        return None

    def on_evaluation(self, eval_return: float, counters: dict[str, float]) -> bool | None:
        """The newest evaluation of the evaluator (`cluster.evaluator: 1`), each time the
        launcher's poll finds a new one: its mean return over `eval.episodes` episodes, and
        the run's counters when it was seen (`env_steps`, `eval_count`, `eval_return_best`,
        ...). Evaluations that end between two polls (`eval.interval_s` shorter than the poll)
        are heard as the newest of them: `eval_count` says how many there were."""
        return None

    def on_checkpoint(self, path: Path) -> bool | None:
        """Each weights checkpoint written: a PS shard's `checkpoints/ps-<i>.npz` (every
        `run.checkpoint_interval_s` and at the stop) or the evaluator's best weights so far,
        `checkpoints/best.npz`. `easyrl.load(run_dir)` loads them."""
        return None

    def on_stop(self, reason: str) -> None:
        """Once, after the run has stopped and every process ended: why it stopped."""
        return None

    def stop(self, reason: str) -> bool:
        """Asks the run to stop, saying why; returns False (a hook may return it)."""
        self.stop_reason = str(reason)
        return False


class CallbackRunner:
    """Calls a run's callbacks from the launcher's poll loop (`easyrl.cluster.launcher`).

    It reads the rows PS shard 0 appends to `metrics.jsonl`, the evaluation count of the
    status it is given and the checkpoint files' modification times; only what is new since
    it was made counts (a resumed run's earlier rows and checkpoints are not reported again).

    Args:
        callbacks: `Callback` instances, called in this order.
        run_dir: the run directory.
        resumed: the run is resumed: its evaluation count starts from the first status.

    Raises:
        EasyRLError: a callback is not a `Callback`.
    """

    def __init__(self, callbacks: Sequence[Callback], run_dir: Path, resumed: bool = False):
        if not isinstance(callbacks, list | tuple):
            raise EasyRLError(
                "callbacks: expected a list of easyrl.Callback instances, got "
                f"{type(callbacks).__name__} {callbacks!r}"
            )
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise EasyRLError(
                    f"callbacks: expected easyrl.Callback instances, got "
                    f"{type(callback).__name__} {callback!r} (subclass easyrl.Callback)"
                )
        self.callbacks = list(callbacks)
        self.error: BaseException | None = None
        """The exception a hook raised (then no hook is called again), or None."""
        self._metrics = run_dir / "metrics.jsonl"
        self._offset = _size(self._metrics)
        self._checkpoints = run_dir / "checkpoints"
        self._seen = self._checkpoint_times()
        self._evals: float | None = None if resumed else 0.0

    def poll(self, counters: dict[str, float]) -> str | None:
        """Calls the hooks for what is new, given PS shard 0's current counters; returns the
        stop reason when a callback asked to stop (or raised)."""
        for row in self._new_rows():
            reason = self._call("on_progress", row)
            if reason:
                return reason
        count = counters.get("eval_count", 0.0)
        if self._evals is None:
            self._evals = count
        elif count > self._evals and "eval_return_mean" in counters:
            self._evals = count
            reason = self._call("on_evaluation", counters["eval_return_mean"], dict(counters))
            if reason:
                return reason
        for path in self._new_checkpoints():
            reason = self._call("on_checkpoint", path)
            if reason:
                return reason
        return None

    def finish(self, reason: str) -> None:
        """After the run stopped: reports the rows and checkpoints written while it stopped
        (a stop asked for then changes nothing), then calls every `on_stop`."""
        for row in self._new_rows():
            self._call("on_progress", row)
        for path in self._new_checkpoints():
            self._call("on_checkpoint", path)
        for callback in self.callbacks:
            if self.error is None:
                self._call_one(callback, "on_stop", reason)

    def _call(self, hook: str, *args: Any) -> str | None:
        """Calls `hook` of every callback; the stop reason of the first that asks to stop."""
        for callback in self.callbacks:
            if self.error is not None:
                return None
            reason = self._call_one(callback, hook, *args)
            if reason:
                return reason
        return None

    def _call_one(self, callback: Callback, hook: str, *args: Any) -> str | None:
        """One hook call; its stop reason when it asked to stop (or raised)."""
        name = type(callback).__name__
        try:
            answer = getattr(callback, hook)(*args)
        except Exception as err:  # the user's code: stop cleanly, then `train` re-raises it
            self.error = err
            return f"callback {name}.{hook} raised {type(err).__name__}: {err}"
        if callback.stop_reason is not None:
            return f"stopped by callback {name}: {callback.stop_reason}"
        if answer is False:
            return f"stopped by callback {name}: {hook} returned False"
        return None

    def _new_rows(self) -> list[dict[str, Any]]:
        """The complete metrics rows appended since the last call."""
        try:
            with self._metrics.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a row being written waits for its end
        self._offset += len(complete)
        rows = []
        for line in complete.splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a killed writer (a resumed run's file)
        return rows

    def _checkpoint_times(self) -> dict[Path, int]:
        """{weights checkpoint: its modification time in ns}."""
        times = {}
        for path in (*self._checkpoints.glob("ps-*.npz"), self._checkpoints / "best.npz"):
            if path.name.count(".") == 1:  # not ps-0.tmp.npz, a checkpoint being written
                try:
                    times[path] = path.stat().st_mtime_ns
                except FileNotFoundError:
                    continue
        return times

    def _new_checkpoints(self) -> list[Path]:
        """The checkpoints written (renamed into place) since the last call."""
        times = self._checkpoint_times()
        new = sorted(p for p, t in times.items() if self._seen.get(p) != t)
        self._seen = times
        return new


def _size(path: Path) -> int:
    """A file's size in bytes (0 when there is none)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
