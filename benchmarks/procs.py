"""Process accounting of the benchmarks, read from /proc (Linux): CPU seconds, memory and
roles of a process tree; and the re-exec with the launcher's glibc malloc settings
(`--tuned-malloc`).

This module does not import TensorFlow.
"""

import os
import sys
from pathlib import Path

from easyrl.cluster.launcher import MALLOC_ENV

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm)" (state first), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of process `pid` so far (None when it is gone or, pid None,
    was never started)."""
    fields = None if pid is None else _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of `pid` in KiB ({} when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def role_of(pid: int) -> str | None:
    """The "ROLE-TASK" of an `easyrl run --role ROLE --task TASK` process, else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "--role" not in argv[:-1]:
        return None
    role = argv[argv.index("--role") + 1]
    task = argv[argv.index("--task") + 1] if "--task" in argv[:-1] else "0"
    return f"{role}-{task}"


def cpu_by_process(root: int | None = None) -> dict[int, tuple[str, float]]:
    """CPU seconds of `root` (default: this process) and every process below it, each
    labelled with its role ("actor-3", from its command line) or, for a process that is
    not a role (a helper a role started, the benchmark itself), with the label of its
    nearest labelled ancestor ("bench" for the root)."""
    root = os.getpid() if root is None else root
    labels = {root: "bench"}
    out = {}
    for pid in [root, *descendants(root)]:  # parents come before their children
        fields = _stat(pid)
        label = labels.get(pid) or role_of(pid)
        if label is None:
            label = labels.get(int(fields[1]) if fields else 0, "bench")
        labels[pid] = label
        seconds = cpu_seconds(pid)
        if seconds is not None:
            out[pid] = (label, seconds)
    return out


def cpu_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each label used between two `cpu_by_process` snapshots (a process that
    started in between counts from zero; one that ended in between is missed)."""
    out: dict[str, float] = {}
    for pid, (label, cpu) in after.items():
        start = before.get(pid, (label, 0.0))[1]
        out[label] = out.get(label, 0.0) + cpu - start
    return out


def by_role(per_label: dict[str, float]) -> dict[str, float]:
    """Sums per-process figures ({"actor-3": x, "bench": y}) by role ({"actor": ..})."""
    out: dict[str, float] = {}
    for label, value in per_label.items():
        role = label.rsplit("-", 1)[0]
        out[role] = out.get(role, 0.0) + value
    return out


def cores_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float
) -> dict[str, float]:
    """CPU cores each label used between two `cpu_by_process` snapshots taken `seconds`
    apart (see `cpu_used`)."""
    return {label: cpu / seconds for label, cpu in cpu_used(before, after).items()}


def reexec_with_malloc_env() -> None:
    """Re-executes this script with MALLOC_ENV set (read by glibc at process start), so
    that the benchmark process and every server it starts run with it."""
    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return
    os.environ.update(MALLOC_ENV)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *sys.argv])


def malloc_note() -> str:
    """Says whether the glibc malloc settings of `--tuned-malloc` are in effect."""
    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return "glibc malloc tuned (" + ", ".join(f"{k}={v}" for k, v in MALLOC_ENV.items()) + ")"
    return "glibc malloc defaults"
