"""Fixtures shared by the protocol tests: PS and memory shards served in this process the
way `easyrl run --role ps|memory` serves them (`easyrl.roles.ps.run`,
`easyrl.roles.memory.run`: the role's servicer, built from a config, behind
`rpc.make_server` with the run's token and the config's TLS files).

The easyrl roles (and TensorFlow, which the PS imports) are imported when a fixture is
used, not when the suite starts.
"""

import multiprocessing.process
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from test_cluster import launch  # noqa: F401 (the `launch` fixture: `easyrl train` runs)

if TYPE_CHECKING:
    from easyrl.roles.common import RoleContext
    from easyrl.roles.memory import MemoryServer
    from easyrl.roles.ps import ParameterServer

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
PS_TOKEN = "ps-test-token"
"""The token of `serve_ps`'s shards."""


# --- the `cluster` marker, enforced ----------------------------------------------------------
# `pytest -m "not cluster"` is the quick signal: it must not pay for child Python processes
# (each imports Python, easyrl and often TensorFlow again). So a test that starts one (an
# `easyrl train/run` subprocess, a role process of a local cluster, a `python -c` check, a
# multiprocessing worker such as an async env's) must carry `@pytest.mark.cluster`; one that
# does not fails, naming the command. Other programs (bash, ip) are not checked.

_running: list[pytest.Item] = []
"""The test being run (set for its setup, call and teardown), or empty between tests."""


class UnmarkedChildProcess(Exception):
    """A test without the `cluster` marker started a child Python process."""


def _python_command(args, executable) -> str | None:
    """The command line, if `args` (as `subprocess.Popen` takes them) start Python or easyrl."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = shlex.split(os.fsdecode(args))
    else:
        argv = [os.fsdecode(a) for a in args]
    program = os.path.basename(os.fsdecode(executable) if executable else argv[0] if argv else "")
    if program.startswith("python") or program == "easyrl":
        return " ".join(argv)
    return None


def _check_child(what: str | None) -> None:
    """Records and refuses `what` (a child Python process) if the running test is unmarked."""
    if what is None or not _running or _running[0].get_closest_marker("cluster"):
        return
    _running[0].stash.setdefault(_UNMARKED, []).append(what)
    raise UnmarkedChildProcess(
        f"{_running[0].nodeid} starts a child Python process ({what[:200]}) but is not "
        "marked @pytest.mark.cluster"
    )


_UNMARKED = pytest.StashKey[list[str]]()
_CALL_FAILED = pytest.StashKey[bool]()
_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _checked_popen_init(self, args, *rest, **kwargs):
    _check_child(_python_command(args, kwargs.get("executable")))
    _popen_init(self, args, *rest, **kwargs)


def _checked_process_start(self):
    _check_child(f"multiprocessing process {self.name}")
    _process_start(self)


subprocess.Popen.__init__ = _checked_popen_init
multiprocessing.process.BaseProcess.start = _checked_process_start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Remembers the running test for `_check_child`."""
    _running.append(item)
    yield
    _running.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fails an unmarked test that started a child Python process, even where the refusal
    was raised in a thread or caught by the code under test."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    started = item.stash.get(_UNMARKED, None)
    if call.when == "teardown" and started and not item.stash.get(_CALL_FAILED, False):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started child Python processes without @pytest.mark.cluster: "
            + "; ".join(started)
        )


class Served:
    """Servicers behind real gRPC servers on 127.0.0.1 and clients to them, as the
    `serve_*` fixtures start them; `close` closes the clients and stops the servers."""

    def __init__(self):
        self.servers, self.clients = [], []

    def start(self, role, servicer, token, client_token, timeout_s=5.0, max_workers=4):
        """Serves `servicer` as `role` ("ps" or "memory") with `token`; returns a client
        that sends `client_token`."""
        address = self.serve(role, servicer, token, max_workers)
        return self.connect(role, address, client_token, timeout_s)

    def serve(self, role, servicer, token, max_workers=4) -> str:
        """Serves `servicer` as `role` with `token`; returns its address."""
        from easyrl.transport import rpc

        server, port = rpc.make_server("127.0.0.1:0", token, max_workers=max_workers)
        rpc.add_servicer(role, servicer, server)
        server.start()
        self.servers.append(server)
        return f"127.0.0.1:{port}"

    def connect(self, role, address, client_token, timeout_s=5.0):
        """Another client to the `role` server at `address`, sending `client_token`."""
        from easyrl.transport import rpc

        client = rpc.Client(
            rpc.stub_class(role), address, client_token, timeout_s=timeout_s, retry_s=1
        )
        self.clients.append(client)
        return client

    def close(self, *closers):
        """Closes the clients, calls each of `closers` (e.g. the servicers' own `close`),
        then stops the servers."""
        for client in self.clients:
            client.close()
        for close in closers:
            close()
        for server in self.servers:
            server.stop(None).wait()


@pytest.fixture
def serve_ps():
    """Starts ParameterServer shards on 127.0.0.1 and returns a factory of (servicer, client);
    the optimizer is SGD with lr 0.1 unless given, the client's token `PS_TOKEN` unless
    given."""
    from easyrl.algorithms.optimizers import OptimizerSpec
    from easyrl.roles.ps import ParameterServer

    served = Served()

    def start(
        shard=0,
        optimizer=None,
        max_staleness=10,
        checkpoint_path=None,
        stats=None,
        token=PS_TOKEN,
    ):
        optimizer = optimizer or OptimizerSpec(kind="sgd", lr=0.1)
        ps = ParameterServer(shard, optimizer, max_staleness, checkpoint_path, stats)
        return ps, served.start("ps", ps, PS_TOKEN, token)

    yield start
    served.close()


_SMALL_RUN = ("env.num_envs=2", "cluster.actor=1")
_SMALL_REPLAY = (
    "algorithm.batch_size=4",
    "replay.capacity=16",
    "replay.min_size_to_sample=4",
    "replay.prefetch=1",
)
TABLE_CONFIGS = {
    "uniform": ("cartpole_apex.yaml", ("replay.kind=uniform", *_SMALL_REPLAY)),
    "prioritized": ("cartpole_apex.yaml", ("replay.kind=prioritized", *_SMALL_REPLAY)),
    "trajectory": (
        "cartpole_impala.yaml",
        (
            "algorithm.batch_size=2",
            "algorithm.unroll_length=3",
            "replay.capacity=8",
            "replay.prefetch=1",
        ),
    ),
    "aggregate": (
        "cartpole_ppo.yaml",
        ("replay.kind=aggregate", "algorithm.rollout_length=4", "replay.capacity=32"),
    ),
}
"""A shipped config per replay table kind, shrunk to a few items: {kind: (file, overrides)}."""


@dataclass
class Shards:
    """One PS shard and one memory shard of a run, served on 127.0.0.1.

    `ctx` is a role context of that run pointing at both (`ctx.client("ps", 0)` is how a
    worker of the run connects)."""

    ctx: "RoleContext"
    ps: "ParameterServer"
    memory: "MemoryServer"


def _context(cfg, token: str | None, run_dir: Path, ps: str, memory: str) -> "RoleContext":
    from easyrl.cluster.spec import ClusterSpec
    from easyrl.roles.common import RoleContext

    cluster = ClusterSpec(ps=(ps,), memory=(memory,), learner=1, actor=cfg.cluster.actor)
    return RoleContext(cfg=cfg, task=0, cluster=cluster, token=token, run_dir=run_dir)


def _frozen(value):
    """A value compared with ==: arrays become (dtype, shape, bytes)."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


class RoleServers:
    """Starts shards like the roles do and stops them all on `close`.

    Args:
        run_dir: the run directory of the contexts (nothing is written there).
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._servers = []
        self._memories = []

    @staticmethod
    def config(kind: str, *overrides: str):
        """The shipped config for replay table `kind`, shrunk, with `overrides` (e.g.
        "security.tls_ca=...") on top."""
        from easyrl import config as config_lib

        name, table = TABLE_CONFIGS[kind]
        return config_lib.load(CONFIGS / name, [*_SMALL_RUN, *table, *overrides])

    def _serve(self, servicer, role: str, ctx, workers: int, largest_bytes: int) -> str:
        from easyrl.transport import rpc

        server, port = rpc.make_server(
            "127.0.0.1:0",
            ctx.token,
            max_workers=workers,
            tls=ctx.tls(),
            max_message_bytes=ctx.message_limit(largest_bytes),  # as the role sizes it
        )
        rpc.add_servicer(role, servicer, server)
        server.start()
        self._servers.append(server)
        return f"127.0.0.1:{port}"

    def start(self, cfg, token: str | None) -> Shards:
        """Serves PS shard 0 (with the run's counters) and memory shard 0 of `cfg`'s run."""
        from easyrl.metrics import RunStats
        from easyrl.roles import memory as memory_role
        from easyrl.roles.ps import ParameterServer, weight_bytes

        ctx = _context(cfg, token, self.run_dir, "127.0.0.1:1", "127.0.0.1:2")
        params = cfg.algorithm.params
        algorithm = ctx.algorithm_spec()
        ps = ParameterServer(
            0, algorithm.optimizer(params), params.max_staleness, None, RunStats(cfg.stop.window)
        )
        ps_address = self._serve(ps, "ps", ctx, 16 + ctx.cluster.actor, weight_bytes(ctx))
        spec = algorithm.replay_spec(params, *ctx.spaces())
        memory = memory_role.build(cfg, spec, 0, ctx.cluster)
        self._memories.append(memory)
        largest = memory_role.largest_message(cfg, spec, memory)
        memory_address = self._serve(memory, "memory", ctx, 16, largest)
        return Shards(_context(cfg, token, self.run_dir, ps_address, memory_address), ps, memory)

    @staticmethod
    def items(spec: dict, start: int, n: int) -> dict[str, np.ndarray]:
        """`n` items matching a table spec; every value derives from the item's index."""
        k = np.arange(start, start + n)
        return {
            name: (k.reshape(-1, *[1] * len(shape)) + np.zeros(shape)).astype(dtype)
            for name, (shape, dtype) in spec.items()
        }

    @staticmethod
    def state(servicer) -> dict:
        """Everything a shard holds that a request could change, read in this process.

        PS: version, round, flags, counters (but `pulls`, which reading the values moves),
        recent returns and the serialized values. Memory: status counters, table size and
        content (a copy of the table's `state_dict`, or what an aggregate table holds).
        """
        from easyrl.transport import easyrl_pb2 as pb

        status = servicer.Status(pb.StatusRequest(), None)
        state = {
            "stopping": status.stopping,
            "counters": {k: v for k, v in status.counters.items() if not k.endswith("/pulls")},
        }
        if not hasattr(servicer, "table"):  # a PS shard
            pull = servicer.Pull(pb.PullRequest(known_version=-1), None)
            state.update(
                version=status.version,
                initialized=status.initialized,
                stop_reason=status.stop_reason,
                shutdown=servicer.shutdown_requested.is_set(),
                returns=list(status.recent_returns),
                round=pull.round,
                values=[t.SerializeToString(deterministic=True) for t in pull.tensors],
            )
            return state
        from easyrl.replay import AggregateTable

        table = servicer.table
        if not isinstance(table, AggregateTable):
            content = table.state_dict()
        else:  # an aggregate table: the round it collects and the items held for it
            content = {
                "round": table.round,
                "size": table.size,
                "inserted": table.inserted,
                "refused": table.refused,
                "released_rounds": table.released_rounds,
                "incomplete_round": table.incomplete_round,
            }
            for name in table.spec:
                parts = [part[name] for part in table._parts]
                content[f"data/{name}"] = np.concatenate(parts) if parts else None
        state["table"] = {k: _frozen(v) for k, v in content.items()}
        return state

    @staticmethod
    def settled_state(servicer, timeout_s: float = 5.0) -> dict:
        """`state` once it stopped moving (a memory shard's table thread fills its
        prefetch queue after inserts)."""
        deadline = time.monotonic() + timeout_s
        state = RoleServers.state(servicer)
        while True:
            time.sleep(0.05)
            again = RoleServers.state(servicer)
            if again == state:
                return state
            assert time.monotonic() < deadline, "the shard's state kept changing"
            state = again

    def close(self) -> None:
        """Stops every server started."""
        for memory in self._memories:
            memory.close()
        for server in self._servers:
            server.stop(None).wait()


@pytest.fixture(scope="module")
def role_servers(tmp_path_factory):
    """A `RoleServers` whose shards live until the end of the test module."""
    servers = RoleServers(tmp_path_factory.mktemp("run"))
    yield servers
    servers.close()
