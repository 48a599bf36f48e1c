"""Loopback tests of the replay-memory shard servicer (easyrl.roles.memory) over real gRPC."""

import threading
import time

import grpc
import numpy as np
import pytest
from conftest import Served

from easyrl.errors import ReplayError, TransportError
from easyrl.replay import (
    BetaSchedule,
    LimitedTable,
    PrioritizedTable,
    RateLimiter,
    Sampled,
    UniformTable,
)
from easyrl.roles.memory import MemoryServer, Op
from easyrl.transport import codec, rpc
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport.clients import MemoryClient

TOKEN = "memory-test-token"
SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}
BATCH = 4  # the server's (prefetched) batch size


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Items whose columns all derive from their index `start + i` (= their key when the
    table is filled from 0 in order), so a sample can be checked item by item."""
    k = np.arange(start, start + n)
    return {
        "obs": (k[:, None] + np.arange(4)[None, :] / 4).astype(np.float32),
        "action": k.astype(np.int64),
        "reward": (k * 0.5).astype(np.float32),
    }


def check_items(data: dict, keys: np.ndarray | None = None) -> None:
    """Every sampled row is a consistent, inserted item (and has the given keys)."""
    k = data["action"]
    np.testing.assert_array_equal(data["obs"], (k[:, None] + np.arange(4) / 4).astype(np.float32))
    np.testing.assert_array_equal(data["reward"], (k * 0.5).astype(np.float32))
    if keys is not None:
        np.testing.assert_array_equal(keys, k)


@pytest.fixture
def serve_memory():
    """Starts MemoryServers on 127.0.0.1; returns a factory of (memory, client)."""
    served, memories = Served(), []

    def start(
        table=None,
        limiter=None,
        batch_size=BATCH,
        prefetch=2,
        beta=None,
        token=TOKEN,
        timeout_s=5.0,
    ):
        table = UniformTable(SPEC, 32, seed=1) if table is None else table
        limiter = RateLimiter(1) if limiter is None else limiter
        beta = BetaSchedule(0.4, 1.0, 100) if beta is None else beta
        memory = MemoryServer(LimitedTable(table, limiter, batch_size, beta), prefetch)
        memories.append(memory)
        return memory, served.start("memory", memory, TOKEN, token, timeout_s, max_workers=8)

    yield start
    served.close(*(memory.close for memory in memories))


def insert(client, batch, priorities=None, timeout_s=None) -> pb.InsertResponse:
    request = pb.InsertRequest(tensors=codec.encode_batch(batch), actor=0)
    if priorities is not None:
        request.priorities.CopyFrom(codec.encode_array("priorities", priorities))
    return client.call("Insert", request, timeout_s=timeout_s)


def sample(client, batch_size, timeout_s=2.0):
    """Returns (ready, data, keys, weights) of a Sample through the learners' client."""
    taken = MemoryClient(client).sample(batch_size, timeout_s)
    if taken is None:
        return False, None, None, None
    assert isinstance(taken, Sampled)
    return True, taken.data, taken.keys, taken.weights


def update(client, keys, priorities) -> pb.UpdatePrioritiesResponse:
    request = pb.UpdatePrioritiesRequest(
        keys=codec.encode_array("keys", np.asarray(keys)),
        priorities=codec.encode_array("priorities", np.asarray(priorities)),
    )
    return client.call("UpdatePriorities", request)


def counters(client) -> dict[str, float]:
    return dict(client.call("Status", pb.StatusRequest()).counters)


def wait_for(predicate, timeout_s=3.0):
    give_up = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.01)


def assert_code(code, client, method, request, **kwargs) -> TransportError:
    with pytest.raises(TransportError) as info:
        client.call(method, request, **kwargs)
    assert info.value.code == code, info.value
    return info.value


# --- Insert / Sample -------------------------------------------------------------------


def test_insert_then_sample_both_paths(serve_memory):
    memory, client = serve_memory()
    reply = insert(client, make_batch(0, 10))
    assert reply.size == 10 and reply.inserted == 10
    reply = insert(client, make_batch(10, 6))
    assert reply.size == 16 and reply.inserted == 16

    for batch_size in (BATCH, 7):  # prefetched path, then queued path
        ready, data, keys, weights = sample(client, batch_size)
        assert ready
        assert sorted(data) == sorted(SPEC)
        for name, (shape, dtype) in SPEC.items():
            assert data[name].dtype == dtype, name
            assert data[name].shape == (batch_size, *shape), name
        assert keys.dtype == np.int64 and keys.shape == (batch_size,)
        assert weights.dtype == np.float32 and weights.shape == (batch_size,)
        np.testing.assert_array_equal(weights, 1.0)  # uniform table
        assert np.all((keys >= 0) & (keys < 16))
        check_items(data, keys)


def test_sample_prioritized_weights(serve_memory):
    table = PrioritizedTable(SPEC, 32, alpha=1.0, seed=3)
    _, client = serve_memory(table=table, beta=BetaSchedule(1.0, 1.0, 0))
    priorities = np.linspace(0.5, 4.0, 12).astype(np.float32)
    insert(client, make_batch(0, 12), priorities=priorities)
    for batch_size in (BATCH, 9):
        ready, data, keys, weights = sample(client, batch_size)
        assert ready and weights.dtype == np.float32
        check_items(data, keys)
        # beta = 1: w_i proportional to 1 / P(i), normalised by the batch max.
        expected = 1.0 / (priorities[keys] + table.priority_epsilon)
        np.testing.assert_allclose(weights, expected / expected.max(), rtol=1e-5)


# --- invalid requests ------------------------------------------------------------------


def table_state(table) -> dict:
    return {k: np.array(v, copy=True) for k, v in table.state_dict().items()}


def assert_invalid_and_unchanged(memory, client, method, request):
    before = table_state(memory.table)
    inserts = counters(client).get("memory/0/inserts")
    err = assert_code(grpc.StatusCode.INVALID_ARGUMENT, client, method, request)
    after = table_state(memory.table)
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    status = counters(client)
    assert status.get("memory/0/inserts") == inserts
    assert status["memory/0/size"] == memory.table.size
    return err


def _wrong_dtype(b):
    return {**b, "obs": b["obs"].astype(np.float64)}


def _int32_action(b):
    return {**b, "action": b["action"].astype(np.int32)}


def _wrong_shape(b):
    return {**b, "obs": np.zeros((len(b["action"]), 5), np.float32)}


def _scalar_obs(b):
    return {**b, "obs": b["obs"][:, 0]}


def _missing(b):
    return {k: v for k, v in b.items() if k != "reward"}


def _extra(b):
    return {**b, "done": np.zeros(len(b["action"]), np.bool_)}


def _nested(b):
    return {**b, "extra": {"x": np.zeros(len(b["action"]), np.float32)}}


def _sizes(b):
    return {**b, "action": b["action"][:-1]}


def _empty(b):
    return {k: v[:0] for k, v in b.items()}


@pytest.fixture
def filled(serve_memory):
    table = PrioritizedTable(SPEC, 16, alpha=0.6, seed=0)
    memory, client = serve_memory(table=table)
    insert(client, make_batch(0, 20), priorities=np.arange(20, dtype=np.float32))  # wrapped
    return memory, client


@pytest.mark.parametrize(
    "mutate",
    [
        _wrong_dtype,
        _int32_action,
        _wrong_shape,
        _scalar_obs,
        _missing,
        _extra,
        _nested,
        _sizes,
        _empty,
    ],
)
def test_insert_bad_batch_invalid_argument(filled, mutate):
    memory, client = filled
    request = pb.InsertRequest(tensors=codec.encode_batch(mutate(make_batch(20, 5))))
    assert_invalid_and_unchanged(memory, client, "Insert", request)


@pytest.mark.parametrize(
    "priorities",
    [
        np.ones(4, np.float32),
        np.ones(6, np.float32),
        np.ones((5, 1), np.float32),
        np.array([1, 2, np.nan, 3, 4], np.float32),
        np.array([1, 2, np.inf, 3, 4], np.float64),
        np.array([1, 2, -0.5, 3, 4], np.float32),
    ],
)
def test_insert_bad_priorities_invalid_argument(filled, priorities):
    memory, client = filled
    request = pb.InsertRequest(tensors=codec.encode_batch(make_batch(20, 5)))
    request.priorities.CopyFrom(codec.encode_array("priorities", priorities))
    assert_invalid_and_unchanged(memory, client, "Insert", request)


def test_insert_corrupt_tensor_invalid_argument(filled):
    memory, client = filled
    request = pb.InsertRequest(tensors=codec.encode_batch(make_batch(20, 5)))
    request.tensors[0].data = request.tensors[0].data[:-1]
    assert_invalid_and_unchanged(memory, client, "Insert", request)


@pytest.mark.parametrize(
    "keys, priorities",
    [
        (np.array([16, 17, 18], np.int64), np.ones(2)),  # mismatched shapes
        (np.array([[16, 17]], np.int64), np.ones((1, 2))),  # not 1-D
        (np.array([16.0, 17.0]), np.ones(2)),  # float keys
        (np.array([16, -1], np.int64), np.ones(2)),  # negative key
        (np.array([16, 20], np.int64), np.ones(2)),  # never issued (inserted == 20)
        (np.array([16, 17], np.int64), np.array([1.0, np.nan])),
        (np.array([16, 17], np.int64), np.array([1.0, np.inf])),
        (np.array([16, 17], np.int64), np.array([1.0, -2.0])),
    ],
)
def test_update_priorities_invalid_argument(filled, keys, priorities):
    memory, client = filled
    request = pb.UpdatePrioritiesRequest(
        keys=codec.encode_array("keys", keys),
        priorities=codec.encode_array("priorities", priorities),
    )
    assert_invalid_and_unchanged(memory, client, "UpdatePriorities", request)
    assert "memory/0/priority_updates" not in counters(client)


@pytest.mark.parametrize(
    "batch_size, timeout_s", [(0, 1.0), (-3, 1.0), (17, 1.0), (3, -1.0), (3, float("nan"))]
)
def test_sample_bad_request_invalid_argument(filled, batch_size, timeout_s):
    memory, client = filled
    request = pb.SampleRequest(batch_size=batch_size, timeout_s=timeout_s)
    assert_invalid_and_unchanged(memory, client, "Sample", request)


def test_unauthenticated_without_token(serve_memory):
    memory, client = serve_memory()
    insert(client, make_batch(0, 4))
    requests = {
        "Insert": pb.InsertRequest(tensors=codec.encode_batch(make_batch(4, 2))),
        "Sample": pb.SampleRequest(batch_size=2, timeout_s=0.1),
        "UpdatePriorities": pb.UpdatePrioritiesRequest(
            keys=codec.encode_array("keys", np.zeros(1, np.int64)),
            priorities=codec.encode_array("priorities", np.ones(1)),
        ),
        "Status": pb.StatusRequest(),
        "Shutdown": pb.ShutdownRequest(),
    }
    for token in (None, "wrong-token"):
        other = rpc.Client(rpc.stub_class("memory"), client.address, token, timeout_s=5)
        try:
            for method, request in requests.items():
                assert_code(grpc.StatusCode.UNAUTHENTICATED, other, method, request)
        finally:
            other.close()
    assert memory.table.inserted == 4 and not memory.stopping.is_set()


# --- priorities ------------------------------------------------------------------------


def test_update_priorities_changes_sampling(serve_memory):
    table = PrioritizedTable(SPEC, 32, alpha=1.0, seed=5)
    memory, client = serve_memory(table=table)
    insert(client, make_batch(0, 32))  # max priority (1.0) for all
    hot = 13
    _, data, keys, _ = sample(client, 16)  # queued path (server batch size is 4)
    check_items(data, keys)
    assert np.sum(keys == hot) <= 2
    reply = update(client, [hot, 3], [1e6, 0.5])
    assert reply.updated == 2
    for _ in range(3):
        _, data, keys, weights = sample(client, 16)
        check_items(data, keys)
        assert np.sum(keys == hot) >= 15, keys
        # The hot item is the most probable one: it has the smallest weight.
        assert weights[keys == hot].max() == weights.min()
    c = counters(client)
    assert c["memory/0/priority_updates"] == 2
    assert c.get("memory/0/stale_priority_keys", 0) == 0


def test_stale_keys_counted(serve_memory):
    table = PrioritizedTable(SPEC, 8, alpha=1.0, seed=0)
    _, client = serve_memory(table=table)
    insert(client, make_batch(0, 5))
    insert(client, make_batch(5, 7))  # keys 0..3 overwritten
    reply = update(client, np.array([0, 3, 4, 11], np.int64), [2.0, 2.0, 2.0, 2.0])
    assert reply.updated == 2
    c = counters(client)
    assert c["memory/0/stale_priority_keys"] == 2
    assert c["memory/0/priority_updates"] == 2
    _, data, keys, _ = sample(client, 7)
    check_items(data, keys)
    assert np.all(keys >= 4)


def test_all_zero_priorities_do_not_kill_the_table_thread(serve_memory):
    """With priority_epsilon=0, zero priorities are legal but nothing can be sampled; the
    shard must refuse samples, not die, and recover once a priority becomes positive."""
    table = PrioritizedTable(SPEC, 16, alpha=1.0, seed=0, priority_epsilon=0.0)
    memory, client = serve_memory(table=table, prefetch=1)
    insert(client, make_batch(0, 8), priorities=np.zeros(8, np.float32))
    assert not sample(client, BATCH, timeout_s=0.2)[0]  # prefetched path: nothing ready
    assert_code(
        grpc.StatusCode.INVALID_ARGUMENT,
        client,
        "Sample",
        pb.SampleRequest(batch_size=3, timeout_s=0.5),
        timeout_s=2.0,
    )
    assert insert(client, make_batch(8, 2), timeout_s=2.0).inserted == 10
    assert update(client, [5], [1.0]).updated == 1
    ready, data, keys, _ = sample(client, BATCH)
    assert ready
    check_items(data, keys)
    # Only key 5 and the two newest items (max priority) have a positive priority.
    assert set(keys.tolist()) <= {5, 8, 9}
    assert memory._thread.is_alive()


# --- rate limiter ----------------------------------------------------------------------


def test_sample_blocks_below_min_size(serve_memory):
    memory, client = serve_memory(limiter=RateLimiter(min_size_to_sample=10))
    insert(client, make_batch(0, 6))
    for batch_size in (BATCH, 3):  # prefetched and queued paths
        start = time.monotonic()
        ready, *_ = sample(client, batch_size, timeout_s=0.3)
        assert not ready
        assert time.monotonic() - start >= 0.25
    assert counters(client)["memory/0/rate_limited_sample"] == 1  # the queued one
    assert counters(client).get("memory/0/samples", 0) == 0
    insert(client, make_batch(6, 4))
    for batch_size in (BATCH, 3):
        ready, data, keys, _ = sample(client, batch_size, timeout_s=2.0)
        assert ready
        check_items(data, keys)


def test_sample_waits_for_inserts(serve_memory):
    _, client = serve_memory(limiter=RateLimiter(min_size_to_sample=4))
    insert(client, make_batch(0, 2))
    results = {}

    def sampler(batch_size):
        results[batch_size] = sample(client, batch_size, timeout_s=3.0)

    threads = [threading.Thread(target=sampler, args=(b,)) for b in (BATCH, 3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert not results
    insert(client, make_batch(2, 2))
    for t in threads:
        t.join(5)
    assert results[BATCH][0] and results[3][0]


def ratio_server(serve_memory):
    """spi=1, error_buffer=2, min_size=2: min_diff=0, max_diff=4; one prefetched batch of 4.

    Single-item inserts: the prefetch samples 4 items once diff reaches 4, then its queue
    is full, so the 9th insert takes diff to 5 and the 10th is refused until a sample.
    """
    limiter = RateLimiter(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=2.0)
    limiter.check_batch_sizes(1, BATCH)
    memory, client = serve_memory(limiter=limiter, prefetch=1)
    for k in range(9):
        assert insert(client, make_batch(k, 1), timeout_s=2.0).inserted == k + 1
    wait_for(lambda: counters(client)["memory/0/ready_batches"] == 1)
    assert counters(client)["memory/0/samples"] == 4
    return memory, client


def test_insert_refused_when_ahead_then_allowed_after_samples(serve_memory):
    memory, client = ratio_server(serve_memory)
    before = table_state(memory.table)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        insert(client, make_batch(9, 1), timeout_s=0.5)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
    assert time.monotonic() - start >= 0.35
    assert memory.table.size == 9 and memory.table.inserted == 9
    for key, value in before.items():
        np.testing.assert_array_equal(table_state(memory.table)[key], value)
    c = counters(client)
    assert c["memory/0/rate_limited_insert"] == 1 and c["memory/0/inserts"] == 9

    ready, data, keys, _ = sample(client, BATCH)  # the prefetch refills: 4 more samples
    assert ready
    check_items(data, keys)
    assert insert(client, make_batch(9, 1), timeout_s=2.0).inserted == 10
    assert memory.table.size == 10


def test_blocked_insert_waits_until_sampled(serve_memory):
    memory, client = ratio_server(serve_memory)
    outcome = {}

    def inserter():
        start = time.monotonic()
        try:
            outcome["reply"] = insert(client, make_batch(9, 1), timeout_s=5.0)
        except TransportError as err:  # pragma: no cover - reported below
            outcome["error"] = err
        outcome["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=inserter)
    thread.start()
    time.sleep(0.4)
    assert thread.is_alive() and not outcome  # really waiting, not failed
    assert memory.table.inserted == 9

    def sampler():
        outcome["sample"] = sample(client, 3, timeout_s=2.0)  # queued path

    other = threading.Thread(target=sampler)
    other.start()
    other.join(5)
    thread.join(5)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["sample"][0]
    assert outcome["reply"].inserted == 10 and outcome["elapsed"] >= 0.35
    assert memory.table.size == 10


# --- status / shutdown -----------------------------------------------------------------


def test_status_counters(serve_memory):
    memory, client = serve_memory(prefetch=1)
    reply = client.call("Status", pb.StatusRequest())
    assert reply.role == "memory" and reply.task == 0 and not reply.stopping
    assert reply.counters["memory/0/size"] == 0
    insert(client, make_batch(0, 5))
    insert(client, make_batch(5, 3))
    wait_for(lambda: counters(client)["memory/0/ready_batches"] == 1)
    c = counters(client)
    assert c["memory/0/inserts"] == 8 and c["memory/0/size"] == 8
    assert c["memory/0/samples"] == BATCH and c["memory/0/sample_batches"] == 1
    assert sample(client, BATCH)[0]
    wait_for(lambda: counters(client)["memory/0/ready_batches"] == 1)
    assert sample(client, 2)[0]
    c = counters(client)
    assert c["memory/0/samples"] == 2 * BATCH + 2
    assert c["memory/0/sample_batches"] == 3
    insert(client, make_batch(8, 30))  # wraps a 32-item table
    c = counters(client)
    assert c["memory/0/inserts"] == 38 and c["memory/0/size"] == 32


def test_shutdown_sets_stopping_and_fails_fast(serve_memory):
    memory, client = serve_memory()
    insert(client, make_batch(0, 8))
    client.call("Shutdown", pb.ShutdownRequest())
    assert memory.stopping.is_set()
    assert client.call("Status", pb.StatusRequest()).stopping
    memory._thread.join(2)
    # After the table thread is gone, calls that need it fail promptly instead of hanging.
    for method, request in (
        ("Insert", pb.InsertRequest(tensors=codec.encode_batch(make_batch(8, 2)))),
        ("Sample", pb.SampleRequest(batch_size=3, timeout_s=1.0)),
        (
            "UpdatePriorities",
            pb.UpdatePrioritiesRequest(
                keys=codec.encode_array("keys", np.zeros(1, np.int64)),
                priorities=codec.encode_array("priorities", np.ones(1)),
            ),
        ),
    ):
        start = time.monotonic()
        try:
            reply = client.call(method, request, timeout_s=2.0)
        except TransportError as err:
            assert err.code != grpc.StatusCode.DEADLINE_EXCEEDED, (method, err)
        else:
            assert method == "Sample" and not reply.ready, (method, reply)
        assert time.monotonic() - start < 1.5, method
    assert memory.table.inserted == 8


def test_beta_schedule():
    beta = BetaSchedule(0.4, 1.0, 10)
    assert beta(0) == pytest.approx(0.4)
    assert beta(5) == pytest.approx(0.7)
    assert beta(10) == beta(1000) == pytest.approx(1.0)
    assert BetaSchedule(0.5, 1.0, 0)(7) == 0.5


BETA = BetaSchedule(0.4, 1.0, 100)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_snapshot_then_restore_gives_back_the_table(tmp_path, kind):
    from easyrl.roles.memory import STORED_KEY, restore

    def make_table():
        if kind == "uniform":
            return UniformTable(SPEC, 32, seed=1)
        return PrioritizedTable(SPEC, 32, alpha=0.6, seed=1)

    table = make_table()
    memory = MemoryServer(LimitedTable(table, RateLimiter(1), BATCH, BETA), 2)
    try:
        memory._submit(Op("insert", 1.0, batch=make_batch(0, 40), n=40))  # wraps the ring
        path = tmp_path / "checkpoints" / "memory-0.npz"
        assert memory.snapshot(path) == 32
        assert memory.counters["snapshot_items"] == 32
        state = memory._submit(Op("snapshot", 0.0))
    finally:
        memory.close()
    assert state.pop(STORED_KEY).shape == (0, 3)  # no numbered insert: no actor's last one
    fresh = make_table()
    assert restore(fresh, path) == 32
    restored = fresh.state_dict()
    assert sorted(restored) == sorted(state)
    for key, value in state.items():
        np.testing.assert_array_equal(restored[key], value)
    assert restore(make_table(), tmp_path / "missing.npz") == 0
    with pytest.raises(ReplayError):  # a snapshot of another table changes nothing
        restore(UniformTable(SPEC, 16, seed=1), path)


def test_a_restarted_shard_knows_the_inserts_its_snapshot_holds(tmp_path):
    from easyrl.roles.memory import restore, restore_stored

    def insert_once(memory, start):
        op = Op("insert", 1.0, batch=make_batch(start, 4), n=4, source=3, sender=77, sequence=5)
        return memory._submit(op)

    memory = MemoryServer(LimitedTable(UniformTable(SPEC, 32, seed=1), RateLimiter(1), BATCH), 2)
    path = tmp_path / "memory-0.npz"
    try:
        assert not insert_once(memory, 0).duplicate
        memory.snapshot(path)
    finally:
        memory.close()
    # The shard restarts from its snapshot; the actor, whose reply was lost, resends.
    table = UniformTable(SPEC, 32, seed=1)
    assert restore(table, path) == 4 and restore_stored(path) == {3: (77, 5)}
    served = LimitedTable(table, RateLimiter(1), BATCH)
    again = MemoryServer(served, 2, stored=restore_stored(path))
    try:
        assert insert_once(again, 0).duplicate and table.size == 4
    finally:
        again.close()
    assert restore_stored(tmp_path / "missing.npz") == {}


def test_insert_whose_caller_gave_up_is_not_stored():
    table = UniformTable(SPEC, 32, seed=1)
    memory = MemoryServer(LimitedTable(table, RateLimiter(1), BATCH, BETA), 2)
    try:
        # The call's deadline passed while the op waited in the queue: storing it would
        # make the actor's resend a duplicate.
        with pytest.raises(ReplayError, match="gave up"):
            memory._submit(Op("insert", 1.0, batch=make_batch(0, 8), n=8, active=lambda: False))
        assert table.size == 0 and memory.counters["inserts_abandoned"] == 8
        memory._submit(Op("insert", 1.0, batch=make_batch(0, 8), n=8))
        assert table.size == 8 and memory.counters["inserts"] == 8
    finally:
        memory.close()


def abandon_calls(address, service, method, request, n, cancel, token=TOKEN) -> list[bytes]:
    """Starts `n` calls of `method` that give up after 0.2 s: by their deadline, or (`cancel`)
    cancelled by the caller. Returns once they have all ended on the caller's side, with the
    replies that came back in time (serialized)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/easyrl.v1.{service}/{method}", request_serializer=lambda m: m.SerializeToString()
        )
        metadata = [("authorization", f"Bearer {token}")]
        timeout = None if cancel else 0.2
        calls = [call.future(request, timeout=timeout, metadata=metadata) for _ in range(n)]
        time.sleep(0.2)
        replies = []
        for future in calls:
            if cancel:
                future.cancel()
            try:  # DEADLINE_EXCEEDED, CANCELLED, or the server's own answer in time
                replies.append(future.result())
            except (grpc.RpcError, grpc.FutureCancelledError):
                pass
        return replies


@pytest.mark.parametrize("cancel", [False, True], ids=["deadline", "cancelled"])
@pytest.mark.parametrize("batch_size", [BATCH, 3], ids=["prefetched", "direct"])
def test_waits_end_when_the_caller_gives_up(serve_memory, cancel, batch_size):
    memory, client = serve_memory()  # an empty table: every Sample waits its timeout_s
    request = pb.SampleRequest(batch_size=batch_size, timeout_s=10.0)
    replies = abandon_calls(client.address, "ReplayMemory", "Sample", request, 21, cancel)
    assert not any(pb.SampleResponse.FromString(reply).ready for reply in replies)
    start = time.monotonic()
    client.call("Status", pb.StatusRequest())
    # With the 8 handler threads parked in the abandoned waits, this took ~9.8 s.
    assert time.monotonic() - start < 3.0
    wait_for(lambda: not memory._pending)  # the table thread dropped their ops
    insert(client, make_batch(0, 8))
    assert sample(client, 3)[0]  # a caller that waits is served


def test_a_resent_insert_is_stored_once(serve_memory):
    memory, client = serve_memory()

    def send(start, sender, sequence, actor=0):
        request = pb.InsertRequest(
            tensors=codec.encode_batch(make_batch(start, 2)),
            actor=actor,
            sender=sender,
            sequence=sequence,
        )
        return client.call("Insert", request)

    assert not send(0, sender=7, sequence=1).duplicate
    # The first attempt was stored but its reply lost (past the caller's deadline): the
    # actor sends the same insert again, with the same number.
    reply = send(0, sender=7, sequence=1)
    assert reply.duplicate and reply.size == 2 and memory.counters["duplicate_inserts"] == 2
    assert not send(2, sender=7, sequence=2).duplicate and memory.table.size == 4
    assert not send(4, sender=9, sequence=1).duplicate  # a restarted actor: a new sender id
    assert not send(6, sender=7, sequence=1, actor=1).duplicate  # another actor's numbers
    for _ in range(2):  # sender 0: no numbering, every insert stored (as before)
        assert not send(8, sender=0, sequence=0).duplicate
    assert memory.table.size == 12 and memory.counters["inserts"] == 12
