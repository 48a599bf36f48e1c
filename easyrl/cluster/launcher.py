"""The embedded default: the whole cluster as local processes on one machine.

`train(cfg)` starts every role at once (PS and memory shards on free loopback ports;
workers retry until the servers listen), waits until the servers answer, shows
progress, restarts crashed processes (see `LocalCluster.check_children`), stops at the
config's stop condition (decided by PS shard 0) and shuts every process down, leaving
no orphan (children die with the launcher too). The component benchmarks start chosen
roles through the same `LocalCluster.start_role`, `wait_servers` and `stop_children`.
"""

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from easyrl import config as config_lib
from easyrl.cluster import rundir
from easyrl.cluster.spec import CLUSTER_ENV, ClusterSpec
from easyrl.cluster.threads import THREADS_ENV, budgets, host_cores
from easyrl.errors import EasyRLError, TransportError
from easyrl.metrics import progress_line, reached_goal
from easyrl.offline.dataset import check_output_dir
from easyrl.transport import rpc, shm
from easyrl.transport.clients import ShardClient, Status, connect

if TYPE_CHECKING:
    from easyrl.callbacks import CallbackRunner

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(64 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(1024 * 1024 * 1024),
    "MALLOC_ARENA_MAX": "1",
}
"""glibc settings every child gets unless set already: glibc returns freed multi-MB buffers to
the kernel, so each large message (Atari batches, weights) paid first-touch page faults again;
kept in the heap, easyrl moved 1.25-1.3x more MB/s through Push and Sample
(benchmarks/bench_wire.py --tuned-malloc, RESULTS.md). One arena: the two thresholds bind the
main arena only; a gRPC thread's own arena mapped a new 64 MB heap for each 21 MB reply and
another thread unmapped it, and a 21 MB Pull moved 0.6x raw gRPC's MB/s instead of 0.96x.
Cost: freed heap is kept (RSS stays at its peak)."""
log = logging.getLogger(__name__)

SERVER_ROLES = ("ps", "memory")
MAX_RESTARTS = 20
"""A process that crashed this many times ends the run instead of being restarted again."""
WORKER_ROLES = ("learner", "actor", "evaluator")
Security = config_lib.SecurityConfig | None
"""A config's `security` section (None: its defaults: plaintext, token only)."""
READY_TIMEOUT_S = 120.0
READY_NOTE_S = 30.0
"""Servers still starting after this long are logged (then again each time as long)."""
GRACE_S = 10.0
FINAL_STATUS_TIMEOUT_S = 20.0
"""How long the summary waits for each server's last Status (a progress poll waits 5 s: once,
on 2 loaded cores with the workers still running, a memory shard did not answer in that
time and its counters were missing from summary.json); a server that is gone fails at
once, so only a hung one costs the wait."""
_PR_SET_PDEATHSIG = 1


def free_ports(host: str, count: int) -> list[int]:
    """Returns `count` distinct free TCP ports on `host` (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


PARENT_ENV = "EASYRL_PARENT_PID"
"""The pid of the process that started an easyrl child process (`spawn_role`, a sweep's
trials): the child dies with it (`adopt_start_env`)."""
CORES_ENV = "EASYRL_CORES"
"""Comma-separated cores a child pins itself to at start-up (a sweep's trials)."""


def die_with_parent(parent_pid: int | None = None) -> None:
    """Has the kernel SIGTERM this process when its parent dies (Linux; elsewhere nothing).
    With `parent_pid` (the parent it was started by), it also ends now if that parent is
    gone already (it then has another parent)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def start_env(cores: Sequence[int] = ()) -> dict[str, str]:
    """Environment entries for an easyrl child process that must die with this one and, given
    `cores`, run on those only; the child applies them itself (`adopt_start_env`). Not in a
    `preexec_fn`: Python code between fork and exec in a process with gRPC threads crashed
    the child (SIGSEGV before exec, an empty log) in about one start of three here."""
    env = {PARENT_ENV: str(os.getpid())}
    if cores:
        env[CORES_ENV] = ",".join(str(c) for c in cores)
    return env


def adopt_start_env() -> None:
    """At the start of an easyrl process: applies (and removes, so that its own children do
    not inherit them) what `start_env` set. The cores are set for every thread there is
    already (numpy's BLAS threads start at import); later threads inherit them."""
    cores = os.environ.pop(CORES_ENV, None)
    if cores:
        wanted = [int(c) for c in cores.split(",")]
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), wanted)
    parent = os.environ.pop(PARENT_ENV, None)
    if parent:
        die_with_parent(int(parent))


def child_pythonpath(current: str | None = None) -> str:
    """PYTHONPATH for the role processes: the launcher's own import directories that are not
    part of the Python installation (its script's directory, the config's, the current one:
    wherever user modules named in the config, such as a custom env, torso or algorithm, are
    found), then the entries of `current`.
    """
    prefixes = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    own = [os.path.abspath(p or os.curdir) for p in sys.path]
    own = [
        p
        for p in own
        if os.path.isdir(p) and not any(p == q or p.startswith(q + os.sep) for q in prefixes)
    ]
    entries = [*own, *filter(None, (current or "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(entries))


def spawn_role(
    role: str,
    task: int,
    config_path: Path,
    env: dict[str, str],
    log_path: Path,
    overrides=(),
) -> subprocess.Popen:
    """Starts `python -m easyrl.cli run --role ROLE --task TASK --config CONFIG` in its own
    session (Ctrl-C reaches the launcher only), logging to `log_path`, dying with its
    parent (`start_env`)."""
    command = [sys.executable, "-m", "easyrl.cli", "run", "--role", role]
    command += ["--task", str(task), "--config", str(config_path)]
    for override in overrides:
        command += ["--set", override]
    with log_path.open("ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, **start_env()},
            start_new_session=True,
        )


@dataclass
class Child:
    """One role process started by the launcher (a server's with its address), started with
    `--set` `overrides` (again on a restart)."""

    role: str
    task: int
    address: str | None
    process: subprocess.Popen
    log_path: Path | None = None
    overrides: tuple[str, ...] = ()
    restarts: int = 0
    crashes: list[tuple[float, str]] = field(default_factory=list)
    """(time.monotonic(), its exception or exit code) of each exit it was restarted after."""
    log_start: int = 0
    """Where in its log the current process's output begins (the log is appended to)."""

    @property
    def name(self) -> str:
        return f"{self.role}-{self.task}"


def placed_counts(cfg) -> dict[str, int]:
    """The processes of each role a local run of `cfg` places on this host."""
    c = cfg.cluster
    return {role: getattr(c, role) or 0 for role in (*SERVER_ROLES, *WORKER_ROLES)}


def thread_budgets(cfg) -> dict[str, int]:
    """The thread budget of each role's processes in a local run of `cfg`: all of them
    share this host's cores (`easyrl.cluster.threads.budgets`)."""
    return budgets(host_cores(), placed_counts(cfg), cfg.cluster.threads)


class LocalCluster:
    """Starts, watches and stops the role processes of one run, all on this host, each with
    its role's thread budget (`threads`, see easyrl.cluster.threads) in EASYRL_THREADS.

    Args:
        cfg: the run's config (its `run.dir` is set); saved as `config_name` there, which
            the children load.
        token: the shared auth token, handed to children through the environment.
        config_name: config.yaml, or config.resumed.yaml for a resumed run (whose own
            config.yaml stays as it is).
    """

    def __init__(self, cfg, token: str, config_name: str = "config.yaml"):
        self.cfg = cfg
        self.run_dir = Path(cfg.run.dir)
        self.config_path = self.run_dir / config_name
        config_lib.save(cfg, self.config_path)
        self.token = token
        c = cfg.cluster
        ports = free_ports(c.host, c.ps + c.memory)
        self.spec = ClusterSpec(
            ps=tuple(f"{c.host}:{p}" for p in ports[: c.ps]),
            memory=tuple(f"{c.host}:{p}" for p in ports[c.ps :]),
            learner=c.learner,
            actor=c.actor or 0,  # None: an offline run, no actors
            evaluator=c.evaluator,
        )
        self.children: list[Child] = []
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.placed = placed_counts(cfg)
        self.cores = host_cores()
        self.threads = thread_budgets(cfg)
        """The thread budget of each role's processes: all of them share this host."""

    def threads_line(self) -> str:
        """`threads per process on 16 cores: ps 1, memory 1, learner 2, actor 1` (the roles
        placed)."""
        shares = ", ".join(f"{r} {n}" for r, n in self.threads.items() if self.placed[r])
        return f"threads per process on {self.cores} cores: {shares}"

    def _env(self, role: str) -> dict[str, str]:
        env = dict(os.environ)
        env[CLUSTER_ENV] = self.spec.to_json()
        env[rpc.TOKEN_ENV] = self.token
        env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        for key, value in MALLOC_ENV.items():
            env.setdefault(key, value)
        env["PYTHONUNBUFFERED"] = "1"
        env[THREADS_ENV] = str(self.threads[role])
        if role != "learner":
            env["CUDA_VISIBLE_DEVICES"] = "-1"  # only learners compute on a GPU
        return env

    def _spawn(self, role: str, task: int, overrides: Sequence[str] = ()) -> subprocess.Popen:
        log_path = self.run_dir / "logs" / f"{role}-{task}.log"
        return spawn_role(role, task, self.config_path, self._env(role), log_path, overrides)

    def start_role(self, role: str, count: int, overrides: Sequence[str] = ()) -> list[Child]:
        """Starts `count` processes of `role` (tasks 0..count-1) with `--set` `overrides`;
        returns them."""
        started = []
        for task in range(count):
            address = getattr(self.spec, role)[task] if role in SERVER_ROLES else None
            log_path = self.run_dir / "logs" / f"{role}-{task}.log"
            start = _size(log_path)
            process = self._spawn(role, task, overrides)
            child = Child(role, task, address, process, log_path, tuple(overrides), log_start=start)
            started.append(child)
        self.children += started
        return started

    def start(self) -> None:
        """Starts every role of the config at once and waits until the servers answer.

        Importing TensorFlow costs each process ~2 s of CPU, and workers retry their first
        calls until the servers listen.
        """
        for role in (*SERVER_ROLES, *WORKER_ROLES):
            self.start_role(role, getattr(self.cfg.cluster, role) or 0)  # actor None: offline
        wait_servers([c for c in self.children if c.address], self.token, self.cfg.security)

    def check_children(self, say: Callable[[str], None]) -> str | None:
        """Restarts crashed processes, telling `say` why each crashed (its last exception and
        its log); returns a failure reason when one must not be restarted: the same exception
        `run.crash_repeats` times within `run.crash_window_s` (a deterministic crash), or
        MAX_RESTARTS restarts.

        A PS shard comes back on its address and restores its newest checkpoint (variables,
        optimizer slots, version, counters, round); workers reconnect. A replay or trajectory
        memory shard comes back with its newest snapshot; an aggregate one (synchronous
        rounds) comes back empty, and the learner abandons the round it lost part of.
        """
        run = self.cfg.run
        for child in self.children:
            code = child.process.poll()
            if code is None or (code == 0 and child.role in WORKER_ROLES):
                continue  # running, or a worker that saw the run stopping and exited cleanly
            now, error = time.monotonic(), last_exception(child)
            child.crashes.append((now, error or f"exit code {code}"))
            where = f"{error or 'no exception logged'} (log: {child.log_path})"
            # The same exception again and again is a deterministic crash (a kill is not).
            same = [t for t, e in child.crashes if e == error and now - t <= run.crash_window_s]
            failure = None
            if error and len(same) >= run.crash_repeats:
                failure = f"crashed {len(same)} times with the same error within "
                failure += f"{run.crash_window_s:g} s: {where}"
            elif child.restarts >= MAX_RESTARTS:
                failure = f"crashed {child.restarts + 1} times; giving up: {where}"
            if failure:
                say(f"{child.name} exited with code {code}: {where}")
                return f"{child.name} {failure}"
            child.restarts += 1
            restart = f"restarting it (restart {child.restarts})"
            say(f"{child.name} exited with code {code}; {restart}: {where}")
            child.log_start = _size(child.log_path)
            child.process = self._spawn(child.role, child.task, child.overrides)
        return None

    def status(self, role: str, task: int, timeout_s: float = 5.0) -> Status | None:
        """Status of one server (None when it does not answer within `timeout_s`)."""
        address, sec = getattr(self.spec, role)[task], self.cfg.security
        client = connect(role, address, self.token, sec, timeout_s=timeout_s, retry_s=0.0)
        try:
            return client.status()
        except TransportError:
            return None
        finally:
            client.close()

    def shutdown(self, workers_stopping: bool) -> None:
        """Stops every process (see `stop_children`), then unlinks the shared-memory segments
        a killed one left (`easyrl.transport.shm`)."""
        stop_children(self.children, self.token, self.cfg.security, workers_stopping)
        removed = shm.remove_run(self.token)
        if removed:
            log.info("removed %d shared-memory segment(s) left by stopped processes", removed)


def _connect(server: Child, token: str, security: Security, retry_s: float = 0.0) -> ShardClient:
    """A client of a server (over TLS too when the roles' calls are)."""
    assert server.address is not None
    security = security or config_lib.SecurityConfig()
    return connect(server.role, server.address, token, security, timeout_s=5.0, retry_s=retry_s)


def wait_servers(servers: Sequence[Child], token: str, security: Security = None) -> None:
    """Blocks until every one of `servers` answers Status.

    Raises:
        EasyRLError: a server exited or did not answer within READY_TIMEOUT_S.
    """
    started = time.monotonic()
    deadline, next_note = started + READY_TIMEOUT_S, started + READY_NOTE_S
    for child in servers:
        client = _connect(child, token, security, retry_s=0.5)
        while True:
            if child.process.poll() is not None:
                raise EasyRLError(f"{child.name} exited during start-up:\n{tail(child)}")
            try:
                client.status()
                break
            except TransportError:
                now = time.monotonic()
                if now > deadline:
                    raise EasyRLError(f"{child.name} did not become ready") from None
                if now > next_note:
                    next_note = now + READY_NOTE_S
                    log.warning(
                        "%s not ready after %.0f s (see %s); waiting up to %.0f s more",
                        child.name,
                        now - started,
                        child.log_path,
                        deadline - now,
                    )
        client.close()


def stop_children(
    children: Sequence[Child], token: str, security: Security = None, workers_stopping: bool = False
) -> None:
    """Stops workers (SIGTERM), then asks the servers to checkpoint and exit (Shutdown RPC,
    else SIGTERM); kills whatever outlives its grace.

    Args:
        workers_stopping: the run reached its stop condition, so workers are exiting on
            their own and get a moment before SIGTERM.
    """
    workers = [c for c in children if c.address is None]
    servers = [c for c in children if c.address is not None]
    if workers_stopping:
        _wait(workers, GRACE_S / 2)
    for child in workers:
        _signal(child, signal.SIGTERM)
    _wait(workers, GRACE_S)
    for child in servers:
        client = _connect(child, token, security)
        try:
            client.shutdown()
        except TransportError:
            _signal(child, signal.SIGTERM)
        client.close()
    _wait(servers, GRACE_S)
    for child in children:
        if child.process.poll() is None:
            log.warning("%s did not stop in time; killing it", child.name)
            _signal(child, signal.SIGKILL)
            child.process.wait()


def _signal(child: Child, signum: int) -> None:
    if child.process.poll() is None:
        child.process.send_signal(signum)


def _wait(children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            continue


def _size(path: Path | None) -> int:
    """A file's size in bytes (0 when there is none)."""
    return path.stat().st_size if path is not None and path.exists() else 0


def last_exception(child: Child) -> str | None:
    """The exception line ("KeyError: 'x'") of the last traceback the child's current process
    wrote to its log, or None."""
    if child.log_path is None:
        return None
    try:
        with child.log_path.open("rb") as f:
            f.seek(child.log_start)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if not starts:
        return None
    after = lines[starts[-1] + 1 :]
    return next((line for line in after if line and not line[0].isspace()), None)


def tail(child: Child, lines: int = 15) -> str:
    """The last lines of a child's log ("" without one)."""
    try:
        text = child.log_path.read_text(errors="replace").splitlines() if child.log_path else []
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def _plain(status: Status | None) -> dict:
    """A server's final Status as summary.json holds it ({} when it did not answer)."""
    if status is None:
        return {}
    kind = status.stop_kind
    return {**status._asdict(), "stop_kind": kind.value if kind else None}


def default_run_dir(cfg) -> str:
    """runs/<name>-<YYYYmmdd-HHMMSS> under the current directory."""
    return str(Path("runs") / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def train(
    cfg, out=sys.stdout, resumed: bool = False, callbacks: "CallbackRunner | None" = None
) -> int:
    """Runs the whole cluster locally until the stop condition (or until one of the
    `callbacks` asks it to stop: exit code 1); returns the exit code (0 when the goal was
    reached).

    Progress lines, crash notices and the final line go to `out`, timed by the run clock of
    PS shard 0 (counted across resumes: the clock of metrics.jsonl and `stop.max_seconds`).
    `resumed`: the run directory holds this run's checkpoints, restored by the servers; its
    config.yaml stays, the effective config is written to config.resumed.yaml.
    """
    run_dir = Path(cfg.run.dir or default_run_dir(cfg)).resolve()
    cfg = replace(cfg, run=replace(cfg.run, dir=str(run_dir)))
    if cfg.output.dir is not None:
        check_output_dir(cfg.output.dir)
    config_name = "config.resumed.yaml" if resumed else "config.yaml"
    cluster = LocalCluster(cfg, rpc.new_token(), config_name)
    # SIGTERM to the launcher shuts the run down like Ctrl-C does.
    # SIGINT too, even where it arrives ignored (started from a non-interactive shell's
    # background job, SIG_IGN is inherited and Python installs no KeyboardInterrupt handler).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    clock = 0.0  # the run clock, as PS shard 0 last reported it

    def say(text: str) -> None:
        print(f"[{clock:6.1f}s] {text}", file=out, flush=True)

    reason, kind, exit_code, ps_stopping = None, None, 1, False
    print(f"run directory: {run_dir}", file=out, flush=True)
    print(cluster.threads_line(), file=out, flush=True)
    try:
        cluster.start()
        next_log = time.monotonic()
        while reason is None:
            time.sleep(0.5)
            failure = cluster.check_children(say)
            if failure:
                raise EasyRLError(failure)  # never a success, whatever the stop condition
            status = cluster.status("ps", 0)
            if status is None:
                continue
            clock = status.elapsed_s
            if time.monotonic() >= next_log:
                next_log = time.monotonic() + cfg.run.log_interval_s
                restarts = sum(c.restarts for c in cluster.children)
                print(progress_line(clock, status.counters, restarts), file=out, flush=True)
            if status.stopping:
                ps_stopping = True
                reason = status.stop_reason or "stopped by PS shard 0"
                kind = status.stop_kind
            elif callbacks is not None:
                reason = callbacks.poll(status.counters)  # a stop reason when one asks
        exit_code = 0 if reached_goal(cfg.stop, kind, cfg.output) else 1
    except KeyboardInterrupt:
        reason, exit_code = "interrupted", 130
    except EasyRLError as err:
        reason = str(err)
    finally:
        servers = {
            f"{c.role}/{c.task}": cluster.status(c.role, c.task, FINAL_STATUS_TIMEOUT_S)
            for c in cluster.children
            if c.role in SERVER_ROLES
        }
        ps0 = servers.get("ps/0")
        clock = (ps0.elapsed_s if ps0 else 0.0) or clock
        summary = {
            "reason": reason,
            "stop_condition": kind.value if kind else None,  # the config key, e.g. stop.max_seconds
            "exit_code": exit_code,
            "elapsed_s": round(clock, 2),  # replaced by the checkpointed clock below
            "wall_s": 0.0,
            "restarts": {c.name: c.restarts for c in cluster.children},
            "crashes": {
                c.name: [why for _, why in c.crashes] for c in cluster.children if c.crashes
            },
            "servers": {name: _plain(status) for name, status in servers.items()},
        }
        cluster.shutdown(workers_stopping=ps_stopping)
        # The run clock is what PS shard 0 checkpointed last (at its shutdown, or before it
        # was killed): what a resume goes on from. Shutting the workers down takes seconds
        # after the servers' last Status, and the shard's clock runs until it stops.
        checkpointed = rundir.checkpointed_clock(run_dir)
        clock = clock if checkpointed is None else checkpointed
        summary["elapsed_s"] = round(clock, 2)
        summary["wall_s"] = round(time.monotonic() - start, 2)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    restarts = [f"{c.name} x{c.restarts}" for c in cluster.children if c.restarts]
    total = sum(c.restarts for c in cluster.children)
    why = f"; {total} restart{'s' * (total != 1)} ({', '.join(restarts)})" if total else ""
    print(f"stopped after {clock:.1f}s: {reason}{why}", file=out, flush=True)
    if callbacks is not None:
        callbacks.finish(reason or "")
    return exit_code
