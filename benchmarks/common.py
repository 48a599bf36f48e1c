"""Shared helpers of the component benchmarks: server processes, timing, RESULTS.md.

Servers run in their own processes, started by the local launcher
(`easyrl.cluster.launcher.LocalCluster.start_role`: `python -m easyrl.cli run --role
ps|memory --task I`), or, where a config cannot express what a benchmark needs, as a
`multiprocessing` "spawn" child that builds the same servicer and `rpc.make_server`
directly (`spawn_memory_server`); the launcher waits for and stops both. The benchmark
process is the client and talks to them with `easyrl.transport.rpc.Client` + the codec,
like the roles do.

This module does not import TensorFlow (neither does the spawned memory server).
"""

import argparse
import datetime
import importlib.metadata
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import yaml

from easyrl.cluster.launcher import (
    MALLOC_ENV,
    Child,
    LocalCluster,
    die_with_parent,
    free_ports,
    stop_children,
    wait_servers,
)
from easyrl.transport import rpc

HOST = "127.0.0.1"
NO_STOP = (
    "stop.episode_return_mean=null",
    "stop.eval_return_mean=null",
    "stop.max_seconds=null",
    "stop.max_env_steps=null",
)
"""Overrides that remove a config's stop condition (clusters measured for a set time)."""
READY_TIMEOUT_S = 120.0
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
REPO = Path(__file__).resolve().parent.parent

RESULTS_HEADER = """# easyrl component benchmarks

Figures written by the scripts in this folder (`--write`; each section names the exact
command that produced it). The component benchmarks run each server in its own process on
loopback. See `benchmarks/README.md` for how to run them.

**Read these numbers as rough.** They were taken on a small shared machine (2 cores) while
other engineers' test runs were using it too; the load average is printed with every
section. Absolute figures move by tens of percent from run to run; compare ratios taken
within one run (each section's own comparisons), not figures across sections or dates.
Each section comes from a single run (its defaults, or the subset named in its command) to
keep the total benchmarking time on the shared machine modest.
"""


# --- machine and output ---------------------------------------------------------------


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine_info() -> dict[str, str]:
    """nproc, CPU, Python and library versions, load average (no TensorFlow import)."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow", "tensorflow-cpu"),
        "grpcio": _version("grpcio"),
        "numpy": _version("numpy"),
        "gymnasium": _version("gymnasium"),
        "protobuf": _version("protobuf"),
    }


def load_average() -> str:
    """The 1-minute load average, as text."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def command_line() -> str:
    """The command this benchmark was started with, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (values formatted with `fmt`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def fmt(value: object) -> str:
    """Numbers with thousands separators and 3 significant digits where small."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def section_text(title: str, started: float, load_before: str, body: str) -> str:
    """A RESULTS.md section: title, command, date, machine, then `body`."""
    info = machine_info()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    machine = (
        f"{info['nproc']} cores ({info['cpu']}), Python {info['python']}, "
        f"tensorflow {info['tensorflow']}, grpcio {info['grpcio']}, numpy {info['numpy']}, "
        f"gymnasium {info['gymnasium']}, protobuf {info['protobuf']}"
    )
    return (
        f"## {title}\n\n"
        f"- command: `{command_line()}`\n"
        f"- date: {date}; wall time {time.monotonic() - started:.0f} s\n"
        f"- machine: {machine}\n"
        f"- load average (1 min) before / after: {load_before} / {load_average()}\n"
        f"- allocator: {malloc_note()}\n\n"
        f"{body.strip()}\n"
    )


def parse_args(parser: argparse.ArgumentParser, tuned_malloc: bool = True) -> argparse.Namespace:
    """Adds the options every benchmark shares (`--write`, `--smoke`, and `--tuned-malloc`
    where it applies), parses, and re-executes with tuned malloc settings when asked."""
    if tuned_malloc:
        parser.add_argument(
            "--tuned-malloc",
            action="store_true",
            help="re-run with the launcher's glibc settings (MALLOC_ENV: thresholds, one "
            "arena) in all processes",
        )
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    add_smoke(parser)
    args = parser.parse_args()
    if getattr(args, "tuned_malloc", False):
        reexec_with_malloc_env()
    return args


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """Adds `--smoke`: the same real processes and code paths with tiny sizes and durations,
    seconds long, which tests/test_benchmarks.py runs so that no script rots unnoticed."""
    parser.add_argument(
        "--smoke", action="store_true", help="a seconds-long run with tiny sizes (the tests')"
    )


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replaces (or appends) the section delimited by markers named `name` in RESULTS.md."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{text.strip()}\n{end}\n"
    old = path.read_text() if path.exists() else RESULTS_HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(old):
        new = pattern.sub(lambda _: block, old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + block
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    print(f"wrote section {name!r} of {path}")


# --- timing -----------------------------------------------------------------------------


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


# --- process accounting (/proc, Linux) ------------------------------------------------

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


# --- server processes ---------------------------------------------------------------


def write_config(raw: dict, directory: Path, name: str = "config.yaml") -> Path:
    """Writes a raw config mapping as YAML (checked by loading it) and returns its path."""
    from easyrl import config as config_lib

    config_lib.from_dict(raw)  # fail here, not in a child, on a bad config
    path = directory / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def client(role: str, address: str | None, token: str, timeout_s: float = 30.0) -> rpc.Client:
    """A client of one server (a launcher `Child`'s address), configured like the roles'
    (token, deadline, retries)."""
    if address is None:
        raise ValueError(f"a {role} client needs a server address, got None (a worker?)")
    return rpc.Client(rpc.stub_class(role), address, token, timeout_s=timeout_s)


class _Spawned:
    """A multiprocessing.Process behind the Popen calls the launcher makes (`pid`, `poll`,
    `send_signal`, `wait`): a launcher `Child` of `spawn_memory_server`."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.process.name, timeout or 0.0)
        return self.process.exitcode


@dataclass
class Cluster:
    """The processes of one benchmark: clusters of the local launcher (one per `start_cli`,
    each with its own ports, run directory and saved config) and spawned memory shards,
    all with one token, under a scratch directory.

    Use as a context manager: on exit every process is stopped the launcher's way
    (`stop_children`: workers by SIGTERM, servers by a Shutdown RPC, then SIGKILL), and
    the scratch directory is removed.
    """

    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="easyrl-bench-")))
    token: str = field(default_factory=rpc.new_token)
    servers: list[Child] = field(default_factory=list)
    clusters: list[LocalCluster] = field(default_factory=list)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def start_cli(
        self,
        config: Path,
        num_ps: int = 0,
        num_memory: int = 0,
        overrides: Sequence[str] = (),
        actors: int = 1,
        wait: bool = True,
    ) -> LocalCluster:
        """Starts `num_ps` PS and `num_memory` memory shards of `config` (+ `overrides`) as
        `easyrl run` processes of a new `LocalCluster`, waits until every one answers
        Status (unless `wait` is false: call `wait_ready`), and returns the cluster.

        Its spec names 1 learner and `actors` actors, and an (unused) address for a
        server role started with 0 processes. Each call gets its own run directory (PS
        shards restore checkpoints from theirs).
        """
        from easyrl import config as config_lib

        counts = dict(ps=max(num_ps, 1), memory=max(num_memory, 1), learner=1, actor=actors)
        overrides = [*overrides, *(f"cluster.{k}={v}" for k, v in counts.items())]
        overrides.append(f"run.dir={self.run_dir / f'run-{len(self.clusters)}'}")
        cluster = LocalCluster(config_lib.load(config, overrides), self.token)
        self.clusters.append(cluster)
        started = cluster.start_role("ps", num_ps) + cluster.start_role("memory", num_memory)
        self.servers += started
        if wait:
            self.wait_ready(started)
        return cluster

    def spawn_memory_server(self, raw_config: dict, spec: dict) -> Child:
        """Starts a memory shard in a multiprocessing "spawn" child that builds
        `easyrl.roles.memory.build(cfg, spec)` + `rpc.make_server` itself, with the
        given table spec {column: (shape, dtype name)}; waits until it answers."""
        (port,) = free_ports(HOST, 1)
        address = f"{HOST}:{port}"
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(
            target=_memory_server_main,
            args=(address, self.token, raw_config, spec),
            name="bench-memory",
            daemon=True,
        )
        process.start()
        popen = cast(subprocess.Popen, _Spawned(process))  # what the launcher calls of it
        server = Child("memory", 0, address, popen)
        self.servers.append(server)
        self.wait_ready([server])
        return server

    def wait_ready(self, servers: Sequence[Child]) -> None:
        """Blocks until every one of `servers` answers Status."""
        wait_servers(servers, self.token)

    def stop(self, children: Sequence[Child] | None = None) -> None:
        """Stops `children` (default: every process started here; see `stop_children`)."""
        if children is None:
            workers = [c for x in self.clusters for c in x.children if c.address is None]
            children = workers + self.servers
        stop_children(children, self.token)
        self.servers = [s for s in self.servers if s not in children]


def _memory_server_main(address: str, token: str, raw_config: dict, spec: dict) -> None:
    """Body of the spawned memory server (see `Cluster.spawn_memory_server`)."""
    import numpy as np

    from easyrl import config as config_lib
    from easyrl.roles import memory as memory_role

    die_with_parent()
    cfg = config_lib.from_dict(raw_config)
    table_spec = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
    # With a run.dir: the shard's snapshot path there, so its write-ahead log is on.
    snapshot = None if cfg.run.dir is None else memory_role.snapshot_path(Path(cfg.run.dir), 0)
    memory = memory_role.build(cfg, table_spec, 0, snapshot=snapshot)
    # Handler threads as `roles.memory.run` sizes them for a cluster of up to 64 actors.
    server, _ = rpc.make_server(address, token, max_workers=16 + 64 + 4)
    rpc.add_servicer("memory", memory, server)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not (stop.is_set() or memory.stopping.is_set()):
        stop.wait(0.2)
    memory.close()
    if memory.log is not None:
        memory.log.close()
    server.stop(grace=1.0).wait()


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
