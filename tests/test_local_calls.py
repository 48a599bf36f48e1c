"""Same-host Inserts, Pushes, Samples and Pulls over a shard's local listener instead of gRPC
(easyrl.transport.local): stored, applied and answered exactly as over gRPC; a connection
without the token, or from another run, gets no call served; a caller talks to no other
user's listener; a malformed call is refused with INVALID_ARGUMENT and changes nothing; a
caller whose connection breaks (the shard went away) makes the call again over gRPC; a caller
that closed its connection is gone for a handler waiting on its behalf."""

import os
import socket
import subprocess
import sys

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


def test_bodies_in_the_segment_go_over_the_local_listener_and_count_as_over_grpc(
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
    taken = client.sample(BATCH, timeout_s=2.0)
    assert taken is not None and client.local.calls == 3 and client.shm_replies == 1
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
    assert pusher.local.calls == 2 and pusher.shm_replies == 1
    assert ps.counters["pulls"] == 1 and ps.counters["shm_replies"] == 1
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
    for _ in range(2):  # into each of its two lending segments
        version = pusher.push(version, grads, values=False, wait=True).version
    assert pusher.local is not None and pusher.local.calls == 2
    before = [segment.name for segment in pusher.shared.lending]
    listener.close()  # what a killed shard's process does to the connection
    assert pusher.push(version, grads, values=False, wait=True).applied  # over gRPC
    assert pusher.local.calls == 2 and ps.counters["shm_requests"] == 3
    after = [segment.name for segment in pusher.shared.lending]
    assert after[0] != before[0] and after[1] == before[1]  # made again with a fresh one
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 3 * 0.1, rtol=1e-6)
    pusher.close()


def test_a_caller_whose_listener_went_away_pulls_over_grpc_into_a_fresh_segment(local_ps):
    ps, raw, listener = local_ps
    puller = ParameterClient(raw, PREFIX)
    puller.assign({"w": np.ones((8,), np.float32)})
    np.testing.assert_allclose(puller.pull().values["w"], 1.0)
    assert puller.local is not None and puller.local.calls == 1
    segment = puller.shared.segment.name
    listener.close()
    np.testing.assert_allclose(puller.pull().values["w"], 1.0)  # over gRPC
    assert puller.local.calls == 1 and puller.shm_replies == 2
    assert puller.shared.segment.name != segment
    puller.close()


def test_a_caller_that_closed_its_connection_is_gone_for_the_handler():
    # A handler waiting for a batch or a round on a local caller's behalf stops waiting
    # once the caller is gone (as over gRPC: items are not handed to a caller that left).
    ours, theirs = socket.socketpair()
    with ours:
        context = local._Context(30.0, ours)
        assert context.is_active()
        theirs.close()
        assert not context.is_active()
    assert not local._Context(0.0, socket.socket(socket.AF_UNIX)).is_active()  # past deadline


@pytest.mark.cluster
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a listener as another user")
def test_a_caller_does_not_talk_to_another_users_listener(local_ps):
    _, raw, listener = local_ps
    listener.close()  # the name is free: another user's process takes it
    name = local.local_name(PREFIX, raw.address)
    script = (
        "import os, socket, sys\n"
        "os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.bind({name!r}); s.listen(4)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    squatter = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "ready\n"
        caller = local.LocalCaller("ps", PREFIX, raw.address, PS_TOKEN)
        with pytest.raises(ConnectionRefusedError, match="another user"):
            caller._connect()
        puller = ParameterClient(raw, PREFIX)
        puller.assign({"w": np.ones((4,), np.float32)})
        np.testing.assert_allclose(puller.pull().values["w"], 1.0)  # over gRPC
        assert puller.local is not None and puller.local.off and puller.local.calls == 0
        puller.close()
    finally:
        squatter.kill()
        squatter.wait()
