"""Same-host Inserts and Pushes over a shard's local listener instead of gRPC
(easyrl.transport.local): stored and applied exactly as over gRPC; a connection without the
token, or from another run, gets no call served; a malformed call is refused with
INVALID_ARGUMENT and changes nothing; a caller whose connection breaks (the shard went away)
sends the call over gRPC."""

import socket

import grpc
import numpy as np
import pytest
from conftest import PS_TOKEN
from test_memory_server import (  # noqa: F401 (serve_memory: the fixture)
    BATCH,
    check_items,
    counters,
    make_batch,
    serve_memory,
)

from easyrl.errors import TransportError
from easyrl.transport import local, shm
from easyrl.transport.clients import MemoryClient, ParameterClient

PREFIX = shm.run_prefix("local-calls-test")


@pytest.fixture
def local_ps(serve_ps):
    """(ps, its raw client, its local listener), shared memory on."""
    ps, raw = serve_ps()
    ps.shared = shm.Attached(PREFIX)
    listener = local.LocalServer("ps", ps, PREFIX, raw.address, PS_TOKEN)
    yield ps, raw, listener
    listener.close()


def test_inserts_and_pushes_go_over_the_local_listener_and_count_as_over_grpc(
    serve_memory,  # noqa: F811
    local_ps,
):
    memory, raw = serve_memory()
    memory.shared = shm.Attached(PREFIX)
    listener = local.LocalServer("memory", memory, PREFIX, raw.address, raw.token)
    client = MemoryClient(raw, PREFIX)
    assert client.insert(make_batch(0, 12)) and client.insert(make_batch(12, 4))
    assert client.local is not None and client.local.calls == 2
    assert counters(raw)["memory/0/inserts"] == 16
    assert counters(raw)["memory/0/shm_requests"] == 2
    taken = client.sample(BATCH, timeout_s=2.0)  # a Sample stays on gRPC
    assert taken is not None
    check_items(taken.data, taken.keys)  # what went in is what is stored
    listener.close()
    client.close()

    ps, raw_ps, _ = local_ps
    pusher = ParameterClient(raw_ps, PREFIX)
    version = pusher.assign({"w": np.ones((64, 64), np.float32)})
    pushed = pusher.push(version, {"w": np.full((64, 64), 2.0, np.float32)}, values=True, wait=True)
    assert pushed.applied and pushed.version == version + 1
    np.testing.assert_allclose(pushed.values["w"], 1.0 - 0.1 * 2.0)  # the values came back
    assert pusher.local is not None and pusher.local.calls == 1
    assert ps.counters["shm_requests"] == 1
    np.testing.assert_allclose(pusher.pull().values["w"], 0.8)  # applied once
    pusher.close()


def test_a_caller_without_the_token_gets_no_call_served(local_ps):
    ps, raw, _ = local_ps
    version = ParameterClient(raw).assign({"w": np.ones((4,), np.float32)})
    # A caller presenting another token is closed before any call is read; the client
    # then sends over gRPC (where its token is checked as always).
    wrong = local.LocalCaller("ps", PREFIX, raw.address, "another token")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(local.local_name(PREFIX, raw.address))
        conn.sendall(local.token_digest("another token") + b"\0" * 64)
        conn.settimeout(5)
        try:
            answered = conn.recv(16)
        except ConnectionResetError:  # closed with the call unread
            answered = b""
        assert answered == b""  # closed, nothing answered
    assert wrong.calls == 0 and ps.version == version
    # Another run's listener name does not exist: nothing to connect to.
    other = local.LocalCaller("ps", shm.run_prefix("another run"), raw.address, PS_TOKEN)
    with pytest.raises(OSError):
        other._connect()


def test_a_malformed_local_call_is_refused_and_changes_nothing(local_ps):
    ps, raw, _ = local_ps
    pusher = ParameterClient(raw, PREFIX)
    version = pusher.assign({"w": np.ones((4,), np.float32)})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(local.local_name(PREFIX, raw.address))
        conn.sendall(local.token_digest(PS_TOKEN))
        for index, data in ((1, b"\xff\xfe not a message"), (7, b"")):
            conn.sendall(local._CALL.pack(index, 5.0, len(data)) + data)
            code, size = local._REPLY.unpack(local._recv_exact(conn, local._REPLY.size))
            details = bytes(local._recv_exact(conn, size)).decode()
            assert code != grpc.StatusCode.OK.value[0], details
    assert ps.version == version
    # A Push naming a segment the shard cannot read: INVALID_ARGUMENT, nothing applied.
    caller = local.LocalCaller("ps", PREFIX, raw.address, PS_TOKEN)
    from easyrl.transport import easyrl_pb2 as pb

    bad = pb.PushRequest(version=version, shm_name=PREFIX + "gone", shm_body=16)
    with pytest.raises(TransportError) as info:
        caller.call(raw.call, "Push", bad, 5.0)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert ps.version == version
    caller.close()
    pusher.close()


def test_a_caller_whose_listener_went_away_sends_over_grpc(local_ps):
    ps, raw, listener = local_ps
    pusher = ParameterClient(raw, PREFIX)
    version = pusher.assign({"w": np.ones((8,), np.float32)})
    grads = {"w": np.ones((8,), np.float32)}
    version = pusher.push(version, grads, values=False, wait=True).version
    assert pusher.local is not None and pusher.local.calls == 1
    listener.close()  # what a killed shard's process does to the connection
    assert pusher.push(version, grads, values=False, wait=True).applied  # over gRPC
    assert pusher.local.calls == 1 and ps.counters["shm_requests"] == 2
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 2 * 0.1)
    pusher.close()
