"""Sampled batches through shared memory between processes of one host
(easyrl.transport.shm): a real memory server on loopback writes the body into the learner
client's segment; a foreign or missing segment, a batch too big and a failed call all fall
back to gRPC's bytes without losing the batch; segments are 0600, named from the run's token,
and gone once their client closes or the launcher cleans up after a kill."""

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from multiprocessing import resource_tracker, shared_memory

import grpc
import numpy as np
import pytest
from test_memory_server import (  # noqa: F401 (serve_memory: the fixture)
    BATCH,
    SPEC,
    check_items,
    counters,
    insert,
    make_batch,
    serve_memory,
)

from easyrl import config as config_lib
from easyrl.errors import TransportError
from easyrl.replay import LimitedTable, RateLimiter, UniformTable
from easyrl.roles.memory import MemoryServer
from easyrl.transport import codec, shm
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport.clients import MemoryClient, ParameterClient

TOKEN = "memory-test-token"
PREFIX = shm.run_prefix(TOKEN)


@pytest.fixture
def filled(serve_memory):  # noqa: F811 (the imported fixture)
    """(memory server with shared memory on, its raw client filled with 16 items)."""
    memory, client = serve_memory()
    memory.shared = shm.Attached(PREFIX)
    insert(client, make_batch(0, 16))
    return memory, client


def segment_files() -> set[str]:
    return {p.name for p in shm.SHM_DIR.glob(f"{PREFIX}*")}


def test_a_same_host_sample_comes_through_shared_memory(filled):
    memory, raw = filled
    before = segment_files()
    client = MemoryClient(raw, PREFIX)
    for batch_size in (BATCH, 7):  # prefetched, then queued
        taken = client.sample(batch_size, timeout_s=2.0)
        assert taken is not None and len(taken.keys) == batch_size
        check_items(taken.data, taken.keys)
        np.testing.assert_array_equal(taken.weights, 1.0)
    assert client.shm_replies == 2 and counters(raw)["memory/0/shm_replies"] == 2
    (name,) = segment_files() - before
    assert stat.S_IMODE(os.stat(shm.SHM_DIR / name).st_mode) == 0o600
    client.close()
    assert segment_files() == before  # unlinked with its client


def test_a_segment_of_another_run_is_never_written_and_the_batch_comes_by_grpc(filled):
    memory, raw = filled
    other = shm.Segment(shm.run_prefix("another run's token"))
    try:
        client = MemoryClient(raw, other.prefix)
        client.shared.segment = other  # what a client of another run would name
        taken = client.sample(BATCH, timeout_s=2.0)
        assert taken is not None and client.shm_replies == 0
        check_items(taken.data, taken.keys)
        assert counters(raw)["memory/0/shm_refused"] == 1
        assert bytes(other.read(8)) == bytes(8)  # untouched
    finally:
        other.close()


def test_a_batch_too_big_for_the_segment_comes_by_grpc_then_the_segment_grows(filled):
    memory, raw = filled
    client = MemoryClient(raw, PREFIX)
    client.shared.segment = shm.Segment(PREFIX, size=16)
    first = client.sample(BATCH, timeout_s=2.0)
    assert first is not None and client.shm_replies == 0
    check_items(first.data, first.keys)
    assert client.shared.segment.size > 16
    second = client.sample(BATCH, timeout_s=2.0)
    assert second is not None and client.shm_replies == 1
    check_items(second.data, second.keys)
    client.close()


def test_a_failed_call_drops_the_segment_the_server_may_still_write(filled):
    memory, raw = filled
    client = MemoryClient(raw, PREFIX)
    assert client.sample(BATCH, timeout_s=2.0) is not None
    used = client.shared.segment.name

    def deadline_passed(*args, **kwargs):  # the server may answer (and write) later
        raise TransportError("Sample: deadline exceeded")

    client.call = deadline_passed
    with pytest.raises(TransportError):
        client.sample(BATCH, timeout_s=0.5)
    assert client.shared.segment.name != used and used not in segment_files()
    client.close()


def test_without_shared_memory_nothing_is_made(serve_memory):  # noqa: F811
    memory, raw = serve_memory()
    memory.shared = shm.Attached(PREFIX)
    insert(raw, make_batch(0, 16))
    before = segment_files()
    client = MemoryClient(raw)  # not on this host, or cluster.shared_memory: false
    assert client.sample(BATCH, timeout_s=2.0) is not None
    assert segment_files() == before and counters(raw).get("memory/0/shm_replies", 0) == 0


def test_only_loopback_servers_share_memory_and_the_config_can_turn_it_off():
    assert shm.same_host("127.0.0.1:7000") and shm.same_host("[::1]:7000")
    assert shm.same_host("localhost:1")
    assert not shm.same_host("10.0.0.3:7000") and not shm.same_host("memory-0.easyrl:7000")
    raw = {"algorithm": {"name": "dqn"}, "env": {"id": "CartPole-v1"}}
    assert config_lib.from_dict(raw).cluster.shared_memory
    assert not config_lib.from_dict(raw, ["cluster.shared_memory=false"]).cluster.shared_memory


def test_the_launcher_removes_what_a_killed_process_left():
    # What a process killed with its resource tracker leaves: a segment nobody unlinks.
    left = shared_memory.SharedMemory(name=f"{PREFIX}killed-0", create=True, size=64)
    resource_tracker.unregister(left._name, "shared_memory")  # pyright: ignore
    left.close()
    assert left.name in segment_files()
    assert shm.remove_run(TOKEN) >= 1
    assert left.name not in segment_files()


@pytest.mark.cluster
def test_a_server_mapping_a_segment_leaves_its_owner_s_cleanup_intact():
    # Owner and server in one process share Python's resource tracker (so do spawned
    # children): the server's mapping must neither make the tracker fail nor cancel the
    # owner's registration, which unlinks the segment of an owner killed with SIGKILL.
    script = (
        "import os, signal\n"
        "from easyrl.transport import shm\n"
        f"segment, server = shm.Segment({PREFIX!r}), shm.Attached({PREFIX!r})\n"
        "segment.write([memoryview(b'abc')])\n"
        "assert server.read(segment.name, 3) == b'abc'\n"
        "server.close()\n"
        "print(segment.name, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    name = done.stdout.strip()
    assert done.returncode == -signal.SIGKILL and name.startswith(PREFIX), done.stderr
    deadline = time.monotonic() + 10
    while name in segment_files() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name not in segment_files()
    assert "Traceback" not in done.stderr


def mapped_count(name: str) -> int:
    """How many mappings of segment `name` this process holds."""
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip().endswith("/" + name) for line in maps)


def test_more_callers_than_a_server_keeps_mappings_of_are_read_and_written_at_once():
    # A server keeps the newest `keep` mappings; one pushed out while another thread copies
    # through it stays open until that copy is done (closing it under the copy failed one of
    # the two calls now and then), and is closed then.
    segments = [shm.Segment(PREFIX) for _ in range(6)]
    server = shm.Attached(PREFIX, keep=2)
    size = segments[0].size
    fills = [memoryview(bytes([i]) * size) for i in range(len(segments))]
    for segment, fill in zip(segments, fills, strict=True):
        segment.write([fill])
    errors = []

    def caller(first: int) -> None:
        try:
            for k in range(200):
                i = (first + k) % len(segments)
                if k % 2:
                    assert server.write(segments[i].name, [fills[i]], size)
                else:
                    assert server.read(segments[i].name, size)[-1] == i
        except Exception as err:  # noqa: BLE001 (reported below, with the thread's others)
            errors.append(repr(err))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        server.close()
        assert [mapped_count(s.name) for s in segments] == [1] * len(segments)  # the owner's
    finally:
        for segment in segments:
            segment.close()


def test_a_memory_server_built_without_a_run_writes_nothing():
    table = LimitedTable(UniformTable(SPEC, 8, seed=0), RateLimiter(1), BATCH)
    assert MemoryServer(table).shared is None


def test_a_same_host_pull_comes_through_shared_memory(serve_ps):
    ps, raw = serve_ps()
    ps.shared = shm.Attached(PREFIX)
    values = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
    client = ParameterClient(raw, PREFIX)
    version = client.assign(values)
    pulled = client.pull()
    assert pulled.version == version and client.shm_replies == 1
    for name, value in values.items():
        np.testing.assert_array_equal(pulled.values[name], value)
    assert client.pull(known_version=version).values is None  # nothing new: no body at all
    with_state = client.pull(optimizer_state=True)
    assert with_state.optimizer_state is not None and client.shm_replies == 2
    assert ps.counters["shm_replies"] == 2 and ps.counters["shm_refused"] == 0
    client.close()


def test_a_full_dev_shm_means_grpc_not_a_crash(filled, monkeypatch):
    memory, raw = filled

    def no_space(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    before = segment_files()
    client = MemoryClient(raw, PREFIX)
    for _ in range(2):
        taken = client.sample(BATCH, timeout_s=2.0)
        assert taken is not None and client.shm_replies == 0
        check_items(taken.data, taken.keys)
    assert segment_files() == before  # the segment that could not be reserved is gone
    client.close()


def test_same_host_inserts_and_pushes_send_their_bodies_through_shared_memory(
    serve_memory,  # noqa: F811
    serve_ps,
):
    memory, raw = serve_memory()
    memory.shared = shm.Attached(PREFIX)
    client = MemoryClient(raw, PREFIX)
    assert client.insert(make_batch(0, 12)) and client.insert(make_batch(12, 4))
    assert client.shm_requests == 2 and counters(raw)["memory/0/inserts"] == 16
    assert counters(raw)["memory/0/shm_requests"] == 2
    taken = client.sample(BATCH, timeout_s=2.0)
    assert taken is not None
    check_items(taken.data, taken.keys)  # what went in through the segment is what is stored

    ps, raw_ps = serve_ps()  # SGD, lr 0.1
    ps.shared = shm.Attached(PREFIX)
    pusher = ParameterClient(raw_ps, PREFIX)
    values = {"w": np.ones((64, 64), np.float32)}  # 16 KiB of gradients
    version = pusher.assign(values)
    grads = {"w": np.full((64, 64), 2.0, np.float32)}
    assert pusher.push(version, grads, values=False, wait=True).applied
    assert pusher.shm_requests == 1 and ps.counters["shm_requests"] == 1
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 0.1 * 2.0)
    client.close()
    pusher.close()


def test_a_request_naming_a_segment_the_server_cannot_read_is_refused_and_changes_nothing(
    filled,
):
    memory, raw = filled
    before = counters(raw)["memory/0/inserts"]
    request = pb.InsertRequest(
        tensors=codec.encode_batch(make_batch(16, 2)),
        shm_name=shm.run_prefix("another run's token") + "1-0",
        shm_body=64,
    )
    with pytest.raises(TransportError) as info:
        raw.call("Insert", request)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert counters(raw)["memory/0/inserts"] == before


def test_a_server_that_takes_no_shared_memory_gets_the_bodies_over_grpc(serve_memory):  # noqa: F811
    memory, raw = serve_memory()  # memory.shared stays None (cluster.shared_memory: false)
    client = MemoryClient(raw, PREFIX)
    for start in (0, 8):  # refused once, resent over gRPC, then gRPC from the start
        assert client.insert(make_batch(start, 8))
    assert client.shm_requests == 0 and counters(raw)["memory/0/inserts"] == 16
    taken = client.sample(BATCH, timeout_s=2.0)
    assert taken is not None and client.shm_replies == 0
    check_items(taken.data, taken.keys)
    client.close()


def test_a_server_that_cannot_see_the_callers_segments_gets_the_bodies_over_grpc(
    filled, serve_ps, tmp_path, monkeypatch
):
    # Containers on one host's network: loopback addresses, but each its own /dev/shm. The
    # servers look for segments in an empty folder; the caller's live in the real one.
    memory, raw = filled
    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    client = MemoryClient(raw, PREFIX)
    for start in (16, 24):  # refused once, resent over gRPC, then gRPC from the start
        assert client.insert(make_batch(start, 8))
    assert client.shm_requests == 0 and counters(raw)["memory/0/inserts"] == 32
    assert counters(raw).get("memory/0/shm_requests", 0) == 0

    ps, raw_ps = serve_ps()  # SGD, lr 0.1
    ps.shared = shm.Attached(PREFIX)
    pusher = ParameterClient(raw_ps, PREFIX)
    version = pusher.assign({"w": np.ones((64, 64), np.float32)})
    grads = {"w": np.full((64, 64), 2.0, np.float32)}
    assert pusher.push(version, grads, values=False, wait=True).applied
    assert pusher.shm_requests == 0 and ps.counters["shm_requests"] == 0
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 0.1 * 2.0)  # applied once
    client.close()
    pusher.close()


def push_framed(grads: dict, version: int = 1) -> codec.Framed:
    body = codec.Body()
    return body.frame(pb.PushRequest(version=version, gradients=body.named(grads), queue=True))


def test_a_same_host_push_lends_its_body_until_the_shard_has_applied_it(serve_ps):
    # The shard reads a queued push's body in the caller's segment (no copy) after answering
    # it, so the caller writes its next push into its other segment, and into the first
    # again only once the shard has let that one go.
    ps, raw = serve_ps()  # SGD, lr 0.1
    ps.shared = shm.Attached(PREFIX)
    pusher = ParameterClient(raw, PREFIX)
    version = pusher.assign({"w": np.ones((64, 64), np.float32)})
    assert ps._optimizer is not None
    apply_flat, gate, at_gate = ps._optimizer.apply_flat, threading.Event(), threading.Event()

    def gated(flat_grads):
        at_gate.set()
        assert gate.wait(10)
        apply_flat(flat_grads)

    ps._optimizer.apply_flat = gated
    grads = {"w": np.full((64, 64), 2.0, np.float32)}
    first = pusher.push(version, grads, values=False)
    assert first.queued and at_gate.wait(10)
    lending = pusher.shared.lending  # pyright: ignore[reportOptionalMemberAccess]
    assert lending[0] is not None and lending[0].lent and lending[1] is None
    second = pusher.push(version, {"w": np.full((64, 64), 4.0, np.float32)}, values=False)
    assert second.queued and lending[1] is not None and lending[1].lent
    name = lending[0].name
    pushed = threading.Thread(target=pusher.push, args=(version, grads), kwargs={"values": False})
    pushed.start()  # waits for the first segment
    time.sleep(0.1)
    assert pushed.is_alive() and lending[0].lent
    gate.set()
    pushed.join(10)
    assert not pushed.is_alive() and lending[0].name == name  # the same segment, let go
    deadline = time.monotonic() + 10
    while ps.version < version + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lending[0].lent and not lending[1].lent
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 0.1 * (2 + 4 + 2))
    assert pusher.shm_requests == 3 and ps.counters["shm_requests"] == 3
    pusher.close()
    assert not {name, lending[1].name} & segment_files()


def test_a_lent_push_the_shard_drops_or_refuses_is_let_go_at_once(serve_ps):
    ps, raw = serve_ps()
    ps.shared = shm.Attached(PREFIX)
    pusher = ParameterClient(raw, PREFIX)
    version = pusher.assign({"w": np.ones(4, np.float32)})
    nan = pusher.push(version, {"w": np.full(4, np.nan, np.float32)}, values=False)
    assert nan.reason == "non-finite"
    with pytest.raises(TransportError) as info:
        pusher.push(version, {"w": np.ones(5, np.float32)}, values=False)  # the wrong shape
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert pusher.shared is not None
    assert [s is not None and not s.lent for s in pusher.shared.lending] == [True, True]
    np.testing.assert_array_equal(pusher.pull().values["w"], 1.0)  # nothing applied
    pusher.close()


def test_a_push_with_an_empty_body_goes_over_grpc_and_the_next_is_lent():
    # A server lends no body of 0 bytes (`Attached.lend`): lent, it would be refused, and
    # the pusher would send every body over gRPC from then on.
    shared = shm.SharedReplies(PREFIX)
    sent = []

    def take(method, message):
        sent.append((message.shm_name, message.shm_lent))
        return pb.PushResponse(queued=True)

    shared.send(take, "Push", push_framed({"e": np.ones(0, np.float32)}), lend=True)
    shared.send(take, "Push", push_framed({"w": np.ones(8, np.float32)}), lend=True)
    (empty_name, empty_lent), (name, lent) = sent
    assert (empty_name, empty_lent) == ("", False) and name and lent
    assert shared.requests == 1
    shared.close()


def test_a_segment_its_server_never_lets_go_is_replaced_after_a_while(monkeypatch):
    # The shard was killed holding it: the caller waits LEND_WAIT_S, then writes into a
    # fresh segment (a live shard would keep its own mapping of the old one).
    monkeypatch.setattr(shm, "LEND_WAIT_S", 0.05)
    shared = shm.SharedReplies(PREFIX)
    sent = []

    def hold(method, message):  # a server that takes the body and never lets it go
        sent.append((message.shm_name, message.shm_lent))
        return pb.PushResponse(queued=True)

    for _ in range(3):
        shared.send(hold, "Push", push_framed({"w": np.ones(8, np.float32)}), lend=True)
    (first, _), (second, _), (third, _) = sent
    assert all(lent for _, lent in sent) and len({first, second, third}) == 3
    assert first not in segment_files() and {second, third} <= segment_files()
    shared.close()
    assert not {second, third} & segment_files()


def test_a_lent_body_s_mapping_pushed_out_while_in_use_is_closed_without_error():
    segments = [shm.Segment(PREFIX) for _ in range(2)]
    server = shm.Attached(PREFIX, keep=1)
    try:
        segments[0].lend()
        lease = server.lend(segments[0].name, 64)
        view = np.frombuffer(lease.body, np.float32)  # a view alive past the release
        assert server.read(segments[1].name, 64)  # pushes the first mapping out
        lease.release()
        lease.release()  # twice: nothing more
        assert not segments[0].lent and view.size == 16
        with pytest.raises(ValueError, match="shm_body"):
            server.lend(segments[1].name, segments[1].size)  # no room for the mark
    finally:
        server.close()
        for segment in segments:
            segment.close()


def test_a_pusher_with_no_room_for_its_second_segment_has_its_bodies_copied(serve_ps, monkeypatch):
    ps, raw = serve_ps()  # SGD, lr 0.1
    ps.shared = shm.Attached(PREFIX)
    reserve, made = os.posix_fallocate, []

    def second_fails(fd, offset, size):  # a small /dev/shm: room for one segment more only
        made.append(size)
        if len(made) == 2:
            raise OSError(28, "No space left on device")
        reserve(fd, offset, size)

    monkeypatch.setattr(os, "posix_fallocate", second_fails)
    pusher = ParameterClient(raw, PREFIX)
    version = pusher.assign({"w": np.ones(8, np.float32)})
    grads = {"w": np.ones(8, np.float32)}
    version = pusher.push(version, grads, values=False, wait=True).version
    assert pusher.shared is not None and pusher.shared.lending[0] is not None
    first = pusher.shared.lending[0].name
    for _ in range(2):
        version = pusher.push(version, grads, values=False, wait=True).version
    assert pusher.shared.segment is not None and len(made) == 3  # none tried again
    assert pusher.shared.lending == [None, None] and first not in segment_files()
    assert pusher.shm_requests == 3 and ps.counters["shm_requests"] == 3
    np.testing.assert_allclose(pusher.pull().values["w"], 1.0 - 3 * 0.1, rtol=1e-6)
    pusher.close()
