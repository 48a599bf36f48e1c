"""Server processes of the component benchmarks: config files, clients, spawned servers
and `Cluster`.

Servers run in their own processes, started by the local launcher
(`easyrl.cluster.launcher.LocalCluster.start_role`: `python -m easyrl.cli run --role
ps|memory --task I`), or, where a config cannot express what a benchmark needs, as a
`multiprocessing` "spawn" child that builds the same servicer and `rpc.make_server`
directly (`spawn_memory_server`); the launcher waits for and stops both. The benchmark
process is the client and talks to them with `easyrl.transport.rpc.Client` + the codec,
like the roles do.

This module does not import TensorFlow (neither does the spawned memory server).
"""

import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import yaml

from easyrl.cluster.launcher import (
    Child,
    LocalCluster,
    die_with_parent,
    free_ports,
    stop_children,
    wait_servers,
)
from easyrl.transport import local, rpc

HOST = "127.0.0.1"
NO_STOP = (
    "stop.episode_return_mean=null",
    "stop.eval_return_mean=null",
    "stop.max_seconds=null",
    "stop.max_env_steps=null",
)
"""Overrides that remove a config's stop condition (clusters measured for a set time)."""
READY_TIMEOUT_S = 120.0


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
    memory_role.share_memory(memory, cfg, token)
    # Handler threads as `roles.memory.run` sizes them for a cluster of up to 64 actors.
    server, _ = rpc.make_server(address, token, max_workers=16 + 64 + 4)
    rpc.add_servicer("memory", memory, server)
    server.start()
    calls = local.serve("memory", memory, address, token)  # same-host callers, as the role's
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not (stop.is_set() or memory.stopping.is_set()):
        stop.wait(0.2)
    if calls is not None:
        calls.close()
    memory.close()
    if memory.log is not None:
        memory.log.close()
    server.stop(grace=1.0).wait()
