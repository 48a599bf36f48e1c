"""The trajectory FIFO of unrolls (easyrl.replay `Table.queue`) and a memory shard serving it
over real gRPC: order, exactly-once delivery, back-pressure, bad input."""

import threading
import time

import grpc
import numpy as np
import pytest

from easyrl.errors import ReplayError, TransportError
from easyrl.replay import LimitedTable, RateLimiter, Table
from easyrl.roles.memory import MemoryServer, Op
from easyrl.transport import codec, rpc
from easyrl.transport import easyrl_pb2 as pb

T = 3
SPEC = {
    "obs": ((T + 1, 2, 2), np.uint8),
    "action": ((T,), np.int64),
    "discount": ((T,), np.float32),
}
TOKEN = "trajectory-test-token"


def unrolls(start: int, n: int) -> dict[str, np.ndarray]:
    """n unrolls whose every column encodes the unroll's index."""
    k = np.arange(start, start + n)
    return {
        "obs": np.broadcast_to(k[:, None, None, None] % 256, (n, T + 1, 2, 2)).astype(np.uint8),
        "action": np.repeat(k[:, None], T, axis=1).astype(np.int64),
        "discount": np.repeat(k[:, None] * 0.5, T, axis=1).astype(np.float32),
    }


def indices(batch: dict) -> list[int]:
    return batch["action"][:, 0].tolist()


def test_fifo_serves_oldest_first_and_each_unroll_once():
    table = Table.queue(SPEC, 8)
    table.insert(unrolls(0, 3))
    table.insert(unrolls(3, 4))
    first = table.sample(5)
    assert indices(first.data) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(first.data["obs"], unrolls(0, 5)["obs"])
    assert first.keys.tolist() == [0, 1, 2, 3, 4] and np.all(first.weights == 1)
    table.insert(unrolls(7, 6))  # wraps around the ring
    assert table.size == 8
    assert indices(table.sample(8).data) == list(range(5, 13))
    assert table.size == 0 and table.inserted == 13 and table.removed == 13


def test_fifo_full_insert_and_oversized_sample_change_nothing():
    table = Table.queue(SPEC, 4)
    table.insert(unrolls(0, 3))
    with pytest.raises(ReplayError, match="full"):
        table.insert(unrolls(3, 2))
    with pytest.raises(ReplayError, match=r"batch_size must be in \[1, 3\]"):
        table.sample(4)
    with pytest.raises(ReplayError, match="no priorities"):
        table.insert(unrolls(3, 1), priorities=np.ones(1))
    with pytest.raises(ReplayError, match="no priorities"):
        table.update_priorities(np.arange(1), np.ones(1))
    with pytest.raises(ReplayError, match="dtype"):
        table.insert({**unrolls(3, 1), "obs": unrolls(3, 1)["obs"].astype(np.float32)})
    assert table.size == 3 and indices(table.sample(3).data) == [0, 1, 2]


def test_fifo_limiter_is_the_queue_state():
    table = Table.queue(SPEC, 4)
    limiter = RateLimiter.queue(table)
    assert limiter.can_insert(4) and not limiter.can_insert(5) and not limiter.can_sample(1)
    table.insert(unrolls(0, 3))
    assert limiter.can_sample(3) and not limiter.can_sample(4) and not limiter.can_insert(2)
    with pytest.raises(ReplayError, match="must hold one insert"):
        limiter.check_batch_sizes(2, 5)
    with pytest.raises(ReplayError, match="capacity must be an int"):
        Table.queue(SPEC, 0)


@pytest.fixture
def fifo_shard():
    """A memory shard with a 6-unroll FIFO (learner batch 2, prefetch 1) on 127.0.0.1."""
    table = Table.queue(SPEC, 6)
    memory = MemoryServer(LimitedTable(table, RateLimiter.queue(table), 2))
    server, port = rpc.make_server("127.0.0.1:0", TOKEN, max_workers=8)
    rpc.add_servicer("memory", memory, server)
    server.start()
    client = rpc.Client(rpc.stub_class("memory"), f"127.0.0.1:{port}", TOKEN, timeout_s=5)
    yield memory, client
    client.close()
    memory.close()
    server.stop(None).wait()


def insert(client, batch, timeout_s=None):
    request = pb.InsertRequest(tensors=codec.encode_batch(batch))
    return client.call("Insert", request, timeout_s=timeout_s)


def sample(client, batch_size, timeout_s=2.0):
    reply = client.call("Sample", pb.SampleRequest(batch_size=batch_size, timeout_s=timeout_s))
    return reply.ready, codec.decode_batch(reply.tensors, reply.body) if reply.ready else None


def test_shard_delivers_every_unroll_once_in_order(fifo_shard):
    _, client = fifo_shard
    got = []
    learner = threading.Thread(
        target=lambda: got.extend(indices(sample(client, 2, timeout_s=5)[1]) for _ in range(5))
    )
    learner.start()
    for start in range(0, 10, 2):
        insert(client, unrolls(start, 2))
    learner.join(10)
    assert [i for batch in got for i in batch] == list(range(10))


def test_full_queue_makes_the_actor_wait_then_refuses(fifo_shard):
    memory, client = fifo_shard
    insert(client, unrolls(0, 4))
    # The prefetch takes one batch of 2 out of the queue: 2 queued + 2 ready = room for 4.
    deadline = time.monotonic() + 3
    while memory.table.size != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    insert(client, unrolls(4, 4))
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        insert(client, unrolls(8, 1), timeout_s=0.5)
    assert info.value.code in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    assert time.monotonic() - started >= 0.3  # it waited for room before giving up
    # A learner taking a batch makes room, and the waiting insert goes through.
    waiting = threading.Thread(target=insert, args=(client, unrolls(8, 1)))
    waiting.start()
    ready, batch = sample(client, 2)
    waiting.join(5)
    assert ready and indices(batch) == [0, 1]
    assert memory.table.inserted == 9


def test_sample_waits_for_a_whole_batch(fifo_shard):
    _, client = fifo_shard
    insert(client, unrolls(0, 1))
    ready, _ = sample(client, 2, timeout_s=0.3)
    assert not ready
    insert(client, unrolls(1, 1))
    ready, batch = sample(client, 2)
    assert ready and indices(batch) == [0, 1]


def test_bad_inserts_and_priority_updates_are_invalid_and_change_nothing(fifo_shard):
    memory, client = fifo_shard
    insert(client, unrolls(0, 1))
    bad = {**unrolls(1, 1), "action": np.zeros((1, T + 1), np.int64)}
    with pytest.raises(TransportError) as info:
        insert(client, bad)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.UpdatePrioritiesRequest(
        keys=codec.encode_array("keys", np.zeros(1, np.int64)),
        priorities=codec.encode_array("priorities", np.ones(1)),
    )
    with pytest.raises(TransportError) as info:
        client.call("UpdatePriorities", request)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert memory.table.inserted == 1 and memory.table.size == 1


def test_fifo_state_dict_round_trip_keeps_order_and_counters():
    table = Table.queue(SPEC, 4)
    table.insert(unrolls(0, 3))
    table.sample(2)
    table.insert(unrolls(3, 3))  # wraps the ring: queue holds 2, 3, 4, 5
    state = table.state_dict()
    assert (state["inserted"], state["removed"], state["capacity"]) == (6, 2, 4)
    assert state["data/action"][:, 0].tolist() == [2, 3, 4, 5]
    fresh = Table.queue(SPEC, 4)
    fresh.load_state_dict(state)
    assert (fresh.size, fresh.inserted, fresh.removed) == (4, 6, 2)
    taken = fresh.sample(4)
    assert indices(taken.data) == [2, 3, 4, 5] and taken.keys.tolist() == [2, 3, 4, 5]
    np.testing.assert_array_equal(taken.data["obs"], unrolls(2, 4)["obs"])


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.pop("removed"),
        lambda s: s.update(extra=1),
        lambda s: s.update(capacity=8),
        lambda s: s.update(removed=-1),
        lambda s: s.update(inserted=2.5),
        lambda s: s.update(inserted=9),  # more items than the capacity
        lambda s: s.update({"data/action": s["data/action"][:1]}),
        lambda s: s.update({"data/obs": s["data/obs"].astype(np.float32)}),
    ],
)
def test_fifo_bad_state_dict_changes_nothing(change):
    source = Table.queue(SPEC, 4)
    source.insert(unrolls(0, 3))
    state = source.state_dict()
    change(state)
    table = Table.queue(SPEC, 4)
    table.insert(unrolls(10, 1))
    with pytest.raises(ReplayError, match="state"):
        table.load_state_dict(state)
    assert (table.size, table.inserted, table.removed) == (1, 1, 0)
    assert indices(table.sample(1).data) == [10]


def test_fifo_shard_snapshot_restores_the_queue(tmp_path):
    from easyrl.roles.memory import restore

    table = Table.queue(SPEC, 8)
    memory = MemoryServer(LimitedTable(table, RateLimiter.queue(table), 2))
    path = tmp_path / "checkpoints" / "memory-0.npz"
    try:
        memory._submit(Op("insert", 1.0, batch=unrolls(0, 5), n=5))
        deadline = time.monotonic() + 5
        while memory._ready.qsize() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the table thread prefetches one batch of 2 (taken from the queue)
        assert memory.snapshot(path) == table.size == 3
        assert memory.counters["snapshot_items"] == 3
    finally:
        memory.close()
    fresh = Table.queue(SPEC, 8)
    assert restore(fresh, path) == 3
    assert indices(fresh.sample(3).data) == [2, 3, 4]
