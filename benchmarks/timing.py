"""Timing helpers of the benchmarks: `Rate` and the loops that measure one (`measure`,
`measure_threads`).

This module does not import TensorFlow.
"""

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from procs import cpu_by_process, cpu_used


@dataclass
class Rate:
    """Calls made over an interval (and the payload bytes they moved).

    `windows` holds (calls, units, seconds) of consecutive sub-intervals of about
    `window_s` each, for medians that resist bursts of load from other processes.
    """

    calls: int
    seconds: float
    units: int = 0
    nbytes: int = 0
    windows: list[tuple[int, int, float]] = field(default_factory=list)
    cpu_seconds: float | None = None
    """CPU seconds the measured processes used over the interval (`measure(cpu_label=...)`)."""

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def units_per_s(self) -> float:
        return self.units / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6

    @property
    def units_per_cpu_s(self) -> float:
        """Units per CPU second of the measured processes: the rate per core they used."""
        if not self.cpu_seconds:
            raise ValueError("this rate was measured without CPU accounting")
        return self.units / self.cpu_seconds

    @property
    def ms_per_call(self) -> float:
        return 1e3 * self.seconds / max(self.calls, 1)

    @property
    def median_units_per_s(self) -> float:
        """Median over the windows of units/s (the overall rate without windows)."""
        if not self.windows:
            return self.units_per_s
        return float(np.median([u / s for _, u, s in self.windows]))


def measure(
    fn: Callable[[], tuple[int, int] | None],
    duration_s: float,
    warmup_s: float = 0.2,
    min_calls: int = 3,
    window_s: float = 0.5,
    cpu_label: str | None = None,
) -> Rate:
    """Calls `fn` repeatedly for `duration_s` (after `warmup_s` of unmeasured calls).

    `fn` may return (units, bytes) it moved in that call (items, payload bytes). With
    `cpu_label`, the rate's `cpu_seconds` are what the processes of that label used over
    the measured interval (`cpu_by_process`: "bench" is this process and the helpers it
    started that are not roles, e.g. gymnasium's env subprocesses).
    """
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        fn()
    calls = units = nbytes = 0
    windows = []
    cpu_before = cpu_by_process() if cpu_label else {}
    start = window_start = time.perf_counter()
    window_calls = window_units = 0
    end = start + duration_s
    while True:
        out = fn()
        calls += 1
        window_calls += 1
        if out is not None:
            units += out[0]
            window_units += out[0]
            nbytes += out[1]
        now = time.perf_counter()
        if now - window_start >= window_s:
            windows.append((window_calls, window_units, now - window_start))
            window_start, window_calls, window_units = now, 0, 0
        if now >= end and calls >= min_calls:
            cpu = cpu_used(cpu_before, cpu_by_process()).get(cpu_label, 0.0) if cpu_label else None
            return Rate(calls, now - start, units, nbytes, windows, cpu)


def measure_threads(
    fns: Sequence[Callable[[], tuple[int, int] | None]], duration_s: float, warmup_s: float = 0.2
) -> Rate:
    """Runs each of `fns` in its own thread for the same interval; returns the total."""
    barrier = threading.Barrier(len(fns) + 1)
    results: list[Rate | BaseException | None] = [None] * len(fns)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = measure(fns[i], duration_s, warmup_s)
        except BaseException as err:  # re-raised in the caller
            results[i] = err

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(fns))]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join()
    rates = []
    for result in results:
        if not isinstance(result, Rate):
            raise result or RuntimeError("a measuring thread returned nothing")
        rates.append(result)
    return Rate(
        sum(r.calls for r in rates),
        max(r.seconds for r in rates),
        sum(r.units for r in rates),
        sum(r.nbytes for r in rates),
    )


def payload_bytes(tensors) -> int:
    """Raw tensor bytes of a list of `pb.Tensor` (what the MB/s columns count)."""
    return sum(len(t.data) for t in tensors)
