"""Health checking (grpc.health.v1) of the listening roles, and the bounded wait of workers
for their peers (`run.peer_timeout_s`): real servers on loopback, real role processes."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from easyrl import config as config_lib
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.cluster.spec import ClusterSpec
from easyrl.errors import TransportError
from easyrl.roles.common import RoleContext, ShardedWeights
from easyrl.roles.ps import ParameterServer
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import rpc

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole_apex.yaml"
TOKEN = "health-test-token"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SGD = OptimizerSpec(kind="sgd", lr=0.1)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check(address: str, timeout_s: float = 2.0) -> int:
    """The health status of `address`, asked the way a kubelet asks: no token, no metadata."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout_s
        )
    return reply.status


def role_command(role: str, ps: str, memory: str, *overrides: str) -> list[str]:
    command = [sys.executable, "-m", "easyrl.cli", "run", "--role", role, "--task", "0"]
    command += ["--config", str(CONFIG), "--ps-hosts", ps, "--memory-hosts", memory]
    command += ["--num-learners", "1", "--num-actors", "1"]
    for override in overrides:
        command += ["--set", override]
    return command


def role_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({rpc.TOKEN_ENV: TOKEN, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"})
    return env


@pytest.fixture
def server():
    """An in-process server made the way the roles make theirs (a PS servicer, a token)."""
    made = []

    def make(address: str = "127.0.0.1:0"):
        srv, port = rpc.make_server(address, TOKEN, max_workers=4)
        rpc.add_servicer("ps", ParameterServer(0, SGD, 10), srv)
        made.append(srv)
        return srv, port

    yield make
    for srv in made:
        srv.stop(None)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_ps_and_memory_processes_serve_health_without_token_until_shutdown(tmp_path):
    ps_port, memory_port = free_ports(2)
    ps, memory = f"127.0.0.1:{ps_port}", f"127.0.0.1:{memory_port}"
    log = (tmp_path / "roles.log").open("w")
    processes = {
        address: subprocess.Popen(
            role_command(role, ps, memory, f"run.dir={tmp_path / 'run'}"),
            env=role_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for role, address in (("ps", ps), ("memory", memory))
    }
    try:
        for address, process in processes.items():
            deadline = time.monotonic() + 120  # a hang guard: TF import on a busy machine
            while True:
                assert process.poll() is None, (tmp_path / "roles.log").read_text()
                try:
                    status = check(address)
                    break
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() < deadline, "the role never listened"
                    time.sleep(0.5)
            assert status == SERVING
        # The exemption is for the health service only: a role's own methods still need it.
        no_token = rpc.Client(rpc.stub_class("ps"), ps, None, retry_s=0.0)
        with pytest.raises(TransportError) as caught:
            no_token.call("Status", pb.StatusRequest())
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
        no_token.close()
        for address, role in ((ps, "ps"), (memory, "memory")):
            client = rpc.Client(rpc.stub_class(role), address, TOKEN, retry_s=0.0)
            client.call("Shutdown", pb.ShutdownRequest())
            client.close()
            assert processes[address].wait(timeout=60) == 0
            with pytest.raises(grpc.RpcError) as gone:
                check(address)
            assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        log.close()


def test_health_is_not_serving_before_start_and_from_stop_on(server):
    srv, port = server()
    # Built, not started (a role restores its state in between): NOT_SERVING.
    assert srv.health.Check(health_pb2.HealthCheckRequest(), None).status == NOT_SERVING
    srv.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(watch).status == SERVING
        stopped = srv.stop(grace=3.0)
        assert next(watch).status == NOT_SERVING  # open streams hear it before the server goes
        stopped.wait()
    with pytest.raises(grpc.RpcError) as gone:
        check(f"127.0.0.1:{port}")
    assert gone.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_serving_needs_no_token_and_is_false_when_nothing_listens(server):
    srv, port = server()
    srv.start()
    assert rpc.Client(rpc.stub_class("ps"), f"127.0.0.1:{port}", None).serving(5.0)
    (nothing,) = free_ports(1)
    assert not rpc.Client(rpc.stub_class("ps"), f"127.0.0.1:{nothing}", None).serving(1.0)


def test_server_binds_a_host_name_from_etc_hosts(server):
    # How a StatefulSet pod binds its own DNS name: the kubelet lists it in /etc/hosts.
    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this machine's host name {name!r} does not resolve")
    srv, port = server(f"{name}:0")
    srv.start()
    assert check(f"{name}:{port}") == SERVING


def context(ps: list[str], memory: list[str] = (), timeout_s: float = 30.0) -> RoleContext:
    cfg = config_lib.load(CONFIG, [f"run.peer_timeout_s={timeout_s}"])
    cluster = ClusterSpec(ps=tuple(ps), memory=tuple(memory), learner=1, actor=1)
    return RoleContext(cfg=cfg, task=0, cluster=cluster, token=TOKEN, run_dir=Path("unused"))


def test_wait_for_peers_waits_for_a_server_that_starts_late(server):
    (port,) = free_ports(1)
    ctx = context([f"127.0.0.1:{port}"])
    srv, _ = server(f"127.0.0.1:{port}")
    starter = threading.Timer(1.0, srv.start)
    starter.start()
    try:
        assert ctx.wait_for_peers(ctx.clients("ps"), threading.Event())
    finally:
        starter.join()


def test_wait_for_peers_names_every_unreachable_peer_after_the_deadline(server):
    srv, port = server()
    srv.start()
    dead_ps, dead_memory = free_ports(2)
    ps = [f"127.0.0.1:{port}", f"127.0.0.1:{dead_ps}"]
    ctx = context(ps, [f"127.0.0.1:{dead_memory}"], timeout_s=1.0)
    with pytest.raises(TransportError) as caught:
        ctx.wait_for_peers([*ctx.clients("ps"), *ctx.clients("memory")], threading.Event())
    message = str(caught.value)
    assert "after 1 s (run.peer_timeout_s)" in message
    assert f"127.0.0.1:{dead_ps}" in message and f"127.0.0.1:{dead_memory}" in message
    assert f"127.0.0.1:{port}" not in message  # the one serving is not blamed
    stop = threading.Event()
    stop.set()
    assert not ctx.wait_for_peers(ctx.clients("memory"), stop)


def test_wait_initialized_gives_up_on_empty_shards_naming_them(server):
    srv, port = server()
    srv.start()
    ctx = context([f"127.0.0.1:{port}"])
    weights = ShardedWeights(ctx.clients("ps"), {"w": tf.Variable([1.0, 2.0])})
    with pytest.raises(TransportError, match=rf"127\.0\.0\.1:{port}.*hold no weights after 0\.5 s"):
        weights.wait_initialized(threading.Event(), timeout_s=0.5)
    assert weights.initialize()
    assert weights.wait_initialized(threading.Event(), timeout_s=0.5)
    assert weights.variables["w"].numpy().tolist() == [1.0, 2.0]


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_actor_process_exits_nonzero_when_its_peers_stay_unreachable():
    ps_port, memory_port = free_ports(2)
    ps, memory = f"127.0.0.1:{ps_port}", f"127.0.0.1:{memory_port}"
    deadline_s = 2
    process = subprocess.Popen(
        role_command("actor", ps, memory, f"run.peer_timeout_s={deadline_s}"),
        env=role_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, waiting_since = [], []
    try:
        for line in process.stderr:  # until the process closes stderr (exits)
            lines.append(line)
            if "waiting up to" in line and not waiting_since:
                waiting_since.append(time.monotonic())
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ended = time.monotonic()
    output = "".join(lines)
    assert code != 0, output
    assert waiting_since, output
    assert f"after {deadline_s} s (run.peer_timeout_s)" in output
    assert ps in output and memory in output
    # Bounded by the configured deadline, not by the clients' 30 s of retries per call.
    assert ended - waiting_since[0] < deadline_s + 15, output
