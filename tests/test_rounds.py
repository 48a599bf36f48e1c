"""Synchronous rounds (PPO, ES): the aggregate table, the memory shard's round RPCs, the PS
shard's round publishing and long-polling Pull, and `ShardedWeights.wait_round`, over real
gRPC on 127.0.0.1."""

import dataclasses
import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import threading  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from conftest import Served  # noqa: E402

from easyrl.algorithms import ppo, registry  # noqa: E402
from easyrl.algorithms.optimizers import OptimizerSpec  # noqa: E402
from easyrl.config import from_dict  # noqa: E402
from easyrl.errors import ConfigError, ReplayError, TransportError  # noqa: E402
from easyrl.metrics import RunStats  # noqa: E402
from easyrl.replay.aggregate import AggregateTable  # noqa: E402
from easyrl.roles import memory as memory_role  # noqa: E402
from easyrl.roles.common import ShardedWeights  # noqa: E402
from easyrl.roles.memory import MemoryServer  # noqa: E402
from easyrl.roles.ps import ParameterServer  # noqa: E402
from easyrl.transport import codec  # noqa: E402
from easyrl.transport import easyrl_pb2 as pb  # noqa: E402
from easyrl.transport.clients import ParameterClient  # noqa: E402

TOKEN = "rounds-test-token"
SPEC = {"obs": ((3,), np.float32), "action": ((), np.int64)}
SGD = OptimizerSpec(kind="sgd", lr=0.1)


def items(start: int, n: int) -> dict[str, np.ndarray]:
    """Items `start .. start + n - 1`; every column derives from the item's id (`action`)."""
    k = np.arange(start, start + n)
    return {
        "obs": (k[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32),
        "action": k.astype(np.int64),
    }


def assert_batch_equal(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def concat(*batches: dict) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def table_state(table: AggregateTable) -> tuple:
    return (
        table.round,
        table.size,
        table.inserted,
        table.refused,
        table.released_rounds,
        [(k, v.copy()) for part in table._parts for k, v in sorted(part.items())],
    )


def assert_state_equal(after: tuple, before: tuple) -> None:
    assert after[:5] == before[:5]
    assert len(after[5]) == len(before[5])
    for (ka, va), (kb, vb) in zip(after[5], before[5]):
        assert ka == kb
        np.testing.assert_array_equal(va, vb)


# --- AggregateTable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes, round_size, ready_after",
    [
        ([2, 3, 1], 6, [False, False, True]),
        ([6], 6, [True]),
        ([1, 1, 1, 1], 3, [False, False, True, True]),  # an over-full round is released whole
        ([5, 4], 6, [False, True]),
        ([1], 1, [True]),
    ],
)
def test_round_released_whole_in_order(sizes, round_size, ready_after):
    table = AggregateTable(SPEC, 16, round_size)
    parts, start = [], 0
    for n, ready in zip(sizes, ready_after, strict=True):
        parts.append(items(start, n))
        assert table.insert(parts[-1], 0) is True
        start += n
        assert table.ready(0) is ready
        assert table.size == start and table.round == 0
        assert not table.ready(1)
    batch = table.take(0)
    assert_batch_equal(batch, concat(*parts))
    assert table.round == 1 and table.size == 0 and not table.ready(0) and not table.ready(1)
    assert table.inserted == start and table.refused == 0 and table.released_rounds == 1

    # The next round is collected and released the same way.
    assert table.insert(items(100, round_size), 1)
    assert_batch_equal(table.take(1), items(100, round_size))
    assert table.round == 2 and table.released_rounds == 2


def test_insert_copies_the_batch():
    table = AggregateTable(SPEC, 8, 2)
    batch = items(0, 2)
    table.insert(batch, 0)
    batch["obs"][:] = -1
    batch["action"][:] = -1
    assert_batch_equal(table.take(0), items(0, 2))


def test_spec_is_normalized_and_a_copy():
    table = AggregateTable({"x": ((2,), "float32")}, 4, 2)
    assert table.spec == {"x": ((2,), np.dtype(np.float32))}
    table.spec["y"] = ((), np.int64)
    assert sorted(table.spec) == ["x"]


@pytest.mark.parametrize(
    "held, round_",
    [
        (5, 0),  # incomplete
        (6, 1),  # complete, but another round
        (2, 1),
        (6, -1),
        (0, 0),  # empty
    ],
)
def test_take_of_incomplete_or_wrong_round_raises(held, round_):
    table = AggregateTable(SPEC, 16, 6)
    if held:
        table.insert(items(0, held), 0)
    before = table_state(table)
    with pytest.raises(ReplayError, match="not ready"):
        table.take(round_)
    assert_state_equal(table_state(table), before)


def test_take_of_a_released_round_raises():
    table = AggregateTable(SPEC, 16, 2)
    table.insert(items(0, 2), 0)
    table.take(0)
    table.insert(items(2, 2), 1)
    before = table_state(table)
    with pytest.raises(ReplayError):
        table.take(0)
    assert_state_equal(table_state(table), before)
    assert_batch_equal(table.take(1), items(2, 2))


def test_stale_insert_refused_and_counted():
    table = AggregateTable(SPEC, 16, 4)
    table.insert(items(0, 4), 0)
    table.take(0)
    table.insert(items(10, 1), 1)  # part of round 1 is held
    before = table_state(table)
    assert table.insert(items(20, 3), 0) is False
    after = table_state(table)
    assert after[3] == before[3] + 3  # counted as refused; nothing else changed
    assert_state_equal((*after[:3], before[3], *after[4:]), before)
    table.insert(items(11, 3), 1)
    assert_batch_equal(table.take(1), items(10, 4))  # the stale items were never mixed in


def test_newer_round_insert_drops_what_is_held():
    table = AggregateTable(SPEC, 16, 4)
    table.insert(items(0, 3), 0)
    assert table.insert(items(50, 2), 2) is True
    assert table.round == 2 and table.size == 2
    assert table.refused == 3 and table.inserted == 5 and table.released_rounds == 0
    assert not table.ready(0) and not table.ready(2)
    table.insert(items(52, 2), 2)
    assert_batch_equal(table.take(2), items(50, 4))
    assert table.round == 3


def test_insert_accepts_numpy_integer_rounds():
    table = AggregateTable(SPEC, 16, 2)
    assert table.insert(items(0, 2), np.int64(1))
    assert table.round == 1 and isinstance(table.round, int)
    assert table.insert(items(2, 1), np.int32(1))
    assert_batch_equal(table.take(1), items(0, 3))


@pytest.mark.parametrize(
    "held_round, ask, round_after, dropped",
    [(0, 0, 0, 0), (3, 1, 3, 0), (0, 2, 2, 3)],
)
def test_catch_up(held_round, ask, round_after, dropped):
    table = AggregateTable(SPEC, 16, 4)
    table.insert(items(0, 3), held_round)
    table.catch_up(ask)
    assert table.round == round_after
    assert table.refused == dropped and table.size == 3 - dropped


@pytest.mark.parametrize("first", ["insert", "catch_up"])
def test_restarted_table_marks_only_its_first_round_incomplete(first):
    table = AggregateTable(SPEC, 16, 4, restarted=True)
    assert table.incomplete_round is None
    if first == "insert":  # an actor ships round 3 after the restart; others shipped before
        table.insert(items(0, 4), 3)
    else:  # the learner asks for round 3 first
        table.catch_up(3)
        table.insert(items(0, 4), 3)
    assert table.incomplete_round == 3 and table.size == 4
    assert not table.ready(3)  # enough items, but some of the round's were lost
    table.catch_up(3)
    table.insert(items(4, 4), 4)  # the learner abandoned 3: round 4 started after the restart
    assert table.incomplete_round == 3 and table.ready(4)
    assert_batch_equal(table.take(4), items(4, 4))


def test_fresh_table_has_no_incomplete_round():
    table = AggregateTable(SPEC, 16, 4)
    table.catch_up(2)
    table.insert(items(0, 4), 2)
    assert table.incomplete_round is None and table.ready(2)


def test_capacity_overflow_raises_and_changes_nothing():
    table = AggregateTable(SPEC, 8, 4)
    table.insert(items(0, 6), 0)
    before = table_state(table)
    with pytest.raises(ReplayError, match="full"):
        table.insert(items(6, 3), 0)
    assert_state_equal(table_state(table), before)
    table.insert(items(6, 2), 0)  # exactly up to capacity is fine
    assert_batch_equal(table.take(0), items(0, 8))


def test_newer_round_overflow_raises_and_changes_nothing():
    table = AggregateTable(SPEC, 4, 3)
    table.insert(items(0, 2), 0)
    before = table_state(table)
    with pytest.raises(ReplayError, match="full"):
        table.insert(items(10, 5), 1)
    assert_state_equal(table_state(table), before)


BAD_BATCHES = {
    "wrong dtype": {**items(0, 2), "obs": items(0, 2)["obs"].astype(np.float64)},
    "wrong item shape": {**items(0, 2), "obs": np.zeros((2, 4), np.float32)},
    "missing column": {"obs": items(0, 2)["obs"]},
    "extra column": {**items(0, 2), "reward": np.zeros(2, np.float32)},
    "sizes disagree": {**items(0, 2), "action": np.arange(3, dtype=np.int64)},
    "empty": items(0, 0),
    "list column": {**items(0, 2), "action": [0, 1]},
    "not a dict": [items(0, 2)],
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
@pytest.mark.parametrize("round_", [0, 1, 5])  # a stale, the current and a newer round
def test_bad_batch_raises_and_changes_nothing(name, round_):
    table = AggregateTable(SPEC, 16, 4)
    table.insert(items(0, 4), 0)
    table.take(0)
    table.insert(items(4, 2), 1)
    before = table_state(table)
    with pytest.raises(ReplayError):
        table.insert(BAD_BATCHES[name], round_)
    assert_state_equal(table_state(table), before)


@pytest.mark.parametrize("round_", [-1, -100, True, False, 1.0, "1", None, np.float32(0)])
def test_bad_round_raises_and_changes_nothing(round_):
    table = AggregateTable(SPEC, 16, 4)
    table.insert(items(0, 2), 0)
    before = table_state(table)
    with pytest.raises(ReplayError, match="round"):
        table.insert(items(2, 2), round_)
    assert_state_equal(table_state(table), before)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        None,
        {"x": (2, np.float32)},  # shape not a tuple
        {"x": ((2,), object)},
        {"x": ((2,), "no-such-dtype")},
        {"x": ((-1,), np.float32)},
        {"": ((), np.float32)},
        {"x": ((2,),)},
    ],
)
def test_bad_spec_raises(spec):
    with pytest.raises(ReplayError):
        AggregateTable(spec, 8, 2)


@pytest.mark.parametrize("capacity, round_size", [(8, 0), (8, -1), (8, 9), (1, 2), (0, 0)])
def test_constructor_rejects_round_size(capacity, round_size):
    with pytest.raises(ReplayError, match="round_size"):
        AggregateTable(SPEC, capacity, round_size)


@pytest.mark.parametrize("capacity, round_size", [(8, 8), (8, 1), (1, 1)])
def test_constructor_accepts_round_size(capacity, round_size):
    table = AggregateTable(SPEC, capacity, round_size)
    assert (table.capacity, table.round_size, table.round, table.size) == (
        capacity,
        round_size,
        0,
        0,
    )


# --- MemoryServer over gRPC -------------------------------------------------------------


@pytest.fixture
def serve_rounds():
    """Starts memory shards holding an AggregateTable; returns a factory of
    (memory, client, connect) where connect() opens another client to the same shard."""
    served, memories = Served(), []

    def start(capacity=16, round_size=8, timeout_s=5.0):
        memory = MemoryServer(AggregateTable(SPEC, capacity, round_size))
        memories.append(memory)
        address = served.serve("memory", memory, TOKEN, max_workers=8)
        connect = functools.partial(served.connect, "memory", address, TOKEN, timeout_s)
        return memory, connect(), connect

    yield start
    served.close(*(memory.close for memory in memories))


def insert(client, batch, round_, actor=0) -> pb.InsertResponse:
    request = pb.InsertRequest(tensors=codec.encode_batch(batch), actor=actor, round=round_)
    return client.call("Insert", request)


def take(client, round_, timeout_s=3.0) -> pb.SampleResponse:
    return client.call("Sample", pb.SampleRequest(round=round_, timeout_s=timeout_s))


def counters(client) -> dict[str, float]:
    return dict(client.call("Status", pb.StatusRequest()).counters)


def assert_code(code, client, method, request) -> TransportError:
    with pytest.raises(TransportError) as info:
        client.call(method, request)
    assert info.value.code == code, info.value
    return info.value


def in_thread(fn, *args):
    """Runs fn(*args) in a thread; returns (thread, box) where box gets result/error/at."""
    box = {}

    def body():
        try:
            box["result"] = fn(*args)
        except Exception as err:  # reported by the test
            box["error"] = err
        box["at"] = time.monotonic()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


def test_learner_waits_for_the_round_and_gets_every_item_once(serve_rounds):
    memory, learner, connect = serve_rounds(capacity=16, round_size=8)
    actors = [connect(), connect()]
    thread, box = in_thread(take, learner, 0, 3.0)
    time.sleep(0.3)
    assert thread.is_alive()  # blocked: nothing inserted yet

    reply = insert(actors[0], items(0, 4), 0, actor=0)
    assert not reply.refused and reply.round == 0 and reply.size == 4 and reply.inserted == 4
    time.sleep(0.2)
    assert thread.is_alive()  # half a round is not a round

    completed = time.monotonic()
    reply = insert(actors[1], items(4, 4), 0, actor=1)
    assert not reply.refused and reply.round == 0 and reply.size == 8
    thread.join(timeout=3)
    assert not thread.is_alive() and "error" not in box, box
    assert completed <= box["at"] < completed + 1.5

    sample = box["result"]
    assert sample.ready and sample.round == 0
    data = codec.decode_batch(sample.tensors, sample.body)
    assert_batch_equal(data, items(0, 8))  # every item exactly once, in arrival order

    c = counters(learner)
    assert c["memory/0/round"] == 1 and c["memory/0/size"] == 0
    assert c["memory/0/rounds_released"] == 1 and c["memory/0/samples"] == 8
    assert c["memory/0/inserts"] == 8 and c.get("memory/0/refused_stale", 0) == 0
    assert memory.table.round == 1 and memory.table.released_rounds == 1


def test_stale_insert_after_release_is_refused_and_counted(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 4), 0)
    assert take(client, 0).ready
    insert(client, items(10, 1), 1)

    reply = insert(client, items(20, 3), 0)  # an actor that is one round behind
    assert reply.refused and reply.round == 1 and reply.size == 1 and reply.inserted == 5
    c = counters(client)
    assert c["memory/0/refused_stale"] == 3 and c["memory/0/inserts"] == 5
    assert c["memory/0/size"] == 1 and c["memory/0/round"] == 1
    assert memory.table.refused == 3

    insert(client, items(11, 3), 1)
    sample = take(client, 1)
    assert sample.ready and sample.round == 1
    assert_batch_equal(codec.decode_batch(sample.tensors, sample.body), items(10, 4))


def test_newer_round_insert_moves_the_shard_on(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 3), 0)
    reply = insert(client, items(40, 2), 2)
    assert not reply.refused and reply.round == 2 and reply.size == 2
    assert memory.table.refused == 3
    insert(client, items(42, 2), 2)
    sample = take(client, 2)
    assert sample.ready and sample.round == 2
    assert_batch_equal(codec.decode_batch(sample.tensors, sample.body), items(40, 4))


def test_sample_of_an_older_round_answers_at_once(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 4), 0)
    take(client, 0)
    insert(client, items(10, 2), 1)
    start = time.monotonic()
    reply = take(client, 0, timeout_s=3.0)
    assert time.monotonic() - start < 1.0
    assert not reply.ready and reply.round == 1 and not reply.tensors
    c = counters(client)
    assert c["memory/0/size"] == 2 and c["memory/0/round"] == 1  # what is held is kept
    assert memory.table.refused == 0


def test_sample_of_a_newer_round_catches_up(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 3), 0)
    reply = take(client, 2, timeout_s=0.2)
    assert not reply.ready and reply.round == 2
    assert memory.table.round == 2 and memory.table.size == 0 and memory.table.refused == 3
    assert insert(client, items(0, 4), 1).refused  # round 1 is now stale
    insert(client, items(20, 4), 2)
    reply = take(client, 2)
    assert reply.ready and reply.round == 2
    assert_batch_equal(codec.decode_batch(reply.tensors, reply.body), items(20, 4))


def test_sample_times_out_and_keeps_the_partial_round(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 3), 0)
    start = time.monotonic()
    reply = take(client, 0, timeout_s=0.3)
    elapsed = time.monotonic() - start
    assert not reply.ready and reply.round == 0 and not reply.tensors
    assert 0.25 <= elapsed < 2.5
    assert counters(client)["memory/0/rate_limited_sample"] == 1
    assert memory.table.size == 3

    reply = take(client, 0, timeout_s=0.0)  # no wait at all
    assert not reply.ready and reply.round == 0

    insert(client, items(3, 1), 0)
    reply = take(client, 0, timeout_s=0.0)  # complete: answers even without waiting
    assert reply.ready
    assert_batch_equal(codec.decode_batch(reply.tensors, reply.body), items(0, 4))


def test_abandoned_sample_does_not_consume_the_round(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    # The server gives up before the caller's 0.3 s deadline (ready=False); on a loaded
    # machine the deadline may still win. Either way the round must not be taken.
    try:
        reply = client.call("Sample", pb.SampleRequest(round=0, timeout_s=3.0), timeout_s=0.3)
        assert not reply.ready and reply.round == 0
    except TransportError as err:
        assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
    insert(client, items(0, 4), 0)
    time.sleep(0.2)
    reply = take(client, 0, timeout_s=1.0)
    assert reply.ready and reply.round == 0
    assert_batch_equal(codec.decode_batch(reply.tensors, reply.body), items(0, 4))


def encoded(batch) -> list[pb.Tensor]:
    return codec.encode_batch(batch)


MALFORMED = {
    "insert wrong dtype": (
        "Insert",
        pb.InsertRequest(
            tensors=encoded({**items(0, 2), "action": np.arange(2, dtype=np.int32)}), round=0
        ),
    ),
    "insert wrong shape": (
        "Insert",
        pb.InsertRequest(tensors=encoded({**items(0, 2), "obs": np.zeros((2, 2), np.float32)})),
    ),
    "insert missing column": (
        "Insert",
        pb.InsertRequest(tensors=encoded({"obs": items(0, 2)["obs"]}), round=0),
    ),
    "insert empty": ("Insert", pb.InsertRequest(tensors=encoded(items(0, 0)), round=0)),
    "insert priorities": (
        "Insert",
        pb.InsertRequest(
            tensors=encoded(items(0, 2)),
            priorities=codec.encode_array("priorities", np.ones(2)),
            round=0,
        ),
    ),
    "insert negative round": ("Insert", pb.InsertRequest(tensors=encoded(items(0, 2)), round=-1)),
    "sample negative round": ("Sample", pb.SampleRequest(round=-1, timeout_s=0.1)),
    "sample negative timeout": ("Sample", pb.SampleRequest(round=0, timeout_s=-0.1)),
    "sample timeout too long": ("Sample", pb.SampleRequest(round=0, timeout_s=600.5)),
    "sample nan timeout": ("Sample", pb.SampleRequest(round=0, timeout_s=float("nan"))),
    "update priorities": (
        "UpdatePriorities",
        pb.UpdatePrioritiesRequest(
            keys=codec.encode_array("keys", np.arange(2)),
            priorities=codec.encode_array("priorities", np.ones(2)),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_requests_are_invalid_and_change_nothing(serve_rounds, name):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    insert(client, items(0, 4), 0)
    take(client, 0)
    insert(client, items(4, 3), 1)
    before_counters, before = counters(client), table_state(memory.table)
    method, request = MALFORMED[name]
    assert_code(grpc.StatusCode.INVALID_ARGUMENT, client, method, request)
    assert counters(client) == before_counters
    assert_state_equal(table_state(memory.table), before)


def ppo_cfg():
    """A PPO config with rollout_length 8 and 2 envs per actor."""
    try:
        raw = {"algorithm": {"name": "ppo", "rollout_length": 8}, "env": {"num_envs": 2}}
        return from_dict(raw)
    except (ConfigError, AttributeError):  # the PPO module may not declare its replay kinds yet
        return SimpleNamespace(
            algorithm=SimpleNamespace(name="ppo", params=ppo.Params(rollout_length=8)),
            env=SimpleNamespace(num_envs=2),
        )


class FakeAlgorithm:
    """An algorithm whose actors ship `rollout_length * num_envs + index` items (its
    `round_share` goes into PPO's spec)."""

    def __init__(self):
        self.calls = []

    def round_share(self, params, num_envs, actor_index, num_actors):
        self.calls.append((actor_index, num_actors))
        return params.rollout_length * num_envs + actor_index


@pytest.mark.parametrize(
    "num_actors, num_memory, shard, actors",
    [
        (1, 1, 0, [0]),
        (4, 1, 0, [0, 1, 2, 3]),
        (4, 2, 0, [0, 2]),
        (4, 2, 1, [1, 3]),
        (5, 2, 0, [0, 2, 4]),
        (5, 2, 1, [1, 3]),
        (5, 3, 2, [2]),
        (3, 3, 1, [1]),
    ],
)
def test_round_size_sums_the_shares_of_the_shards_actors(
    num_actors, num_memory, shard, actors, monkeypatch
):
    cfg, module = ppo_cfg(), FakeAlgorithm()
    # With PPO's own shares: rollout_length * num_envs per actor.
    assert memory_role.round_size(cfg, num_actors, num_memory, shard) == 16 * len(actors)
    spec = dataclasses.replace(ppo.SPEC, round_share=module.round_share)
    monkeypatch.setattr(registry, "spec", lambda name: spec)
    size = memory_role.round_size(cfg, num_actors, num_memory, shard)
    assert size == sum(16 + i for i in actors)
    assert module.calls == [(i, num_actors) for i in actors]


def aggregate_cfg(capacity: int):
    return SimpleNamespace(
        algorithm=SimpleNamespace(name="ppo", params=ppo.Params(rollout_length=8)),
        env=SimpleNamespace(num_envs=2, atari=None),
        actor=SimpleNamespace(send_every=1),
        model=SimpleNamespace(lstm=0),
        replay=SimpleNamespace(kind="aggregate", capacity=capacity, prefetch=2),
        run=SimpleNamespace(seed=0),
        input=SimpleNamespace(dir=None),
        multiagent=SimpleNamespace(enabled=False),
    )


def test_build_makes_an_aggregate_shard_sized_by_its_actors():
    cluster = SimpleNamespace(actor=3, memory=["127.0.0.1:1", "127.0.0.1:2"])
    built = [memory_role.build(aggregate_cfg(64), SPEC, shard, cluster) for shard in (0, 1)]
    try:
        assert all(isinstance(m.table, AggregateTable) and not m.table.prefetch for m in built)
        assert [m.table.round_size for m in built] == [32, 16]  # actors {0, 2} and {1}
        assert [m.shard for m in built] == [0, 1]
        assert built[0].table.spec == SPEC and built[0].table.capacity == 64
    finally:
        for m in built:
            m.close()
    with pytest.raises(ReplayError, match="capacity"):
        memory_role.build(aggregate_cfg(20), SPEC, 0, cluster)


# --- ParameterServer rounds -------------------------------------------------------------


def ps_values(shift: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32) + shift}


@pytest.fixture
def serve_ps():
    """Starts ParameterServer shards; returns a factory of (ps, client, connect)."""
    served = Served()

    def start(shard=0, checkpoint_path=None, stats=None):
        ps = ParameterServer(shard, SGD, 10, checkpoint_path, stats)
        address = served.serve("ps", ps, TOKEN, max_workers=8)

        def connect():
            return ParameterClient(served.connect("ps", address, TOKEN, timeout_s=10))

        return ps, connect(), connect

    yield start
    served.close()


def assign(client, values, only_if_empty=True) -> pb.AssignResponse:
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=only_if_empty)
    return client.call("Assign", request)


def pull(client, min_round=0, wait_s=0.0, known_version=-1) -> pb.PullResponse:
    request = pb.PullRequest(known_version=known_version, min_round=min_round, wait_s=wait_s)
    return client.call("Pull", request)


def publish(client, round_) -> pb.PublishRoundResponse:
    return client.call("PublishRound", pb.PublishRoundRequest(round=round_))


def ps_round(client) -> float:
    reply = client.call("Status", pb.StatusRequest())
    return reply.counters[f"ps/{reply.task}/round"]


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


def test_pull_long_polls_until_the_round_is_published(serve_ps):
    ps, client, connect = serve_ps(stats=RunStats())
    assign(client, ps_values())
    learner = connect()
    thread, box = in_thread(pull, client, 1, 5.0)
    time.sleep(0.3)
    assert thread.is_alive()  # waiting for round 1

    published = time.monotonic()
    assert not publish(learner, 1).stopping
    thread.join(timeout=4)
    assert not thread.is_alive() and "error" not in box, box
    assert published <= box["at"] < published + 1.5
    reply = box["result"]
    assert reply.round == 1 and reply.version == 1 and not reply.current
    assert_batch_equal(codec.decode_named(reply.tensors, reply.body), ps_values())
    assert ps.round == 1 and ps_round(client) == 1


@pytest.mark.parametrize(
    "published, min_round, wait_s",
    [(0, 0, 5.0), (2, 1, 5.0), (2, 2, 5.0), (2, 0, 600.0), (0, 3, 0.0)],
)
def test_pull_answers_at_once_when_it_need_not_wait(serve_ps, published, min_round, wait_s):
    ps, client, _ = serve_ps()
    assign(client, ps_values())
    if published:
        publish(client, published)
    reply, elapsed = timed(pull, client, min_round, wait_s, known_version=1)
    assert elapsed < 1.0
    assert reply.round == published and reply.current and reply.version == 1


def test_pull_wait_expires_with_the_old_round(serve_ps):
    ps, client, _ = serve_ps()
    assign(client, ps_values())
    publish(client, 1)
    reply, elapsed = timed(pull, client, 2, 0.3)
    assert 0.25 <= elapsed < 2.5
    assert reply.round == 1 and reply.version == 1
    assert_batch_equal(codec.decode_named(reply.tensors, reply.body), ps_values())


def test_pull_of_an_empty_shard_waits_and_reports_the_round(serve_ps):
    ps, client, connect = serve_ps()
    thread, box = in_thread(pull, client, 1, 5.0)
    time.sleep(0.2)
    publish(connect(), 1)
    thread.join(timeout=4)
    assert box["result"].version == 0 and box["result"].round == 1
    assert not box["result"].tensors


def test_pull_wait_is_capped_by_the_call_deadline(serve_ps):
    ps, client, _ = serve_ps()
    assign(client, ps_values())
    start = time.monotonic()
    try:  # the shard answers just before the deadline; under load the answer may be late
        reply = client.call("Pull", pb.PullRequest(min_round=1, wait_s=30.0), timeout_s=0.5)
        assert reply.round == 0
    except TransportError as err:
        assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED, err
    # Either way the handler stopped waiting near the deadline, not after wait_s.
    while ps.counters["pulls"] < 1:
        assert time.monotonic() - start < 3.0, "the Pull handler is still waiting"
        time.sleep(0.01)


def test_non_zero_shard_takes_publish_rounds_but_no_reports(serve_ps):
    ps, client, _ = serve_ps(shard=1, stats=None)
    assign(client, ps_values())
    assert not publish(client, 2).stopping
    assert ps.round == 2 and ps_round(client) == 2
    assert pull(client, 2, 5.0).round == 2

    for request in (
        pb.ReportRequest(role="actor", task=0, env_steps=10),
        pb.ReportRequest(role="learner", updates=1),
    ):
        assert_code(grpc.StatusCode.INVALID_ARGUMENT, client, "Report", request)
        assert ps.round == 2  # a rejected report publishes nothing


def test_shard_zero_publishes_and_counts(serve_ps):
    stats = RunStats()
    ps, client, _ = serve_ps(shard=0, stats=stats)
    assert not client.publish_round(1)
    assert not client.report("learner", 0, updates=4)
    assert ps.round == 1 and stats.snapshot()["updates"] == 4


def test_rounds_never_go_backwards(serve_ps):
    ps, client, _ = serve_ps()
    assign(client, ps_values())
    for round_, expected in [(3, 3), (2, 3), (3, 3), (1, 3), (4, 4)]:
        publish(client, round_)
        assert ps.round == expected and ps_round(client) == expected
        assert pull(client).round == expected
    ps.publish(0)
    assert ps.round == 4


@pytest.mark.parametrize(
    "method, request_",
    [
        ("PublishRound", pb.PublishRoundRequest(round=-1)),
        ("PublishRound", pb.PublishRoundRequest(round=0)),
        ("Pull", pb.PullRequest(min_round=-1)),
        ("Pull", pb.PullRequest(min_round=1, wait_s=-0.5)),
        ("Pull", pb.PullRequest(min_round=1, wait_s=600.5)),
        ("Pull", pb.PullRequest(min_round=1, wait_s=float("nan"))),
        ("Pull", pb.PullRequest(min_round=1, wait_s=float("inf"))),
    ],
)
@pytest.mark.parametrize("shard", [0, 1])
def test_bad_round_arguments_are_invalid(serve_ps, method, request_, shard):
    ps, client, _ = serve_ps(shard=shard, stats=RunStats() if shard == 0 else None)
    assign(client, ps_values())
    publish(client, 2)
    before = client.call("Status", pb.StatusRequest()).counters
    assert_code(grpc.StatusCode.INVALID_ARGUMENT, client, method, request_)
    after = client.call("Status", pb.StatusRequest()).counters
    assert ps.round == 2 and after[f"ps/{shard}/round"] == 2
    assert after[f"ps/{shard}/pulls"] == before[f"ps/{shard}/pulls"]


def test_round_survives_checkpoint_and_restore(serve_ps, tmp_path):
    path = tmp_path / "checkpoints" / "ps-1.npz"
    ps, client, _ = serve_ps(shard=1, checkpoint_path=path)
    assign(client, ps_values())
    publish(client, 4)
    ps.checkpoint()
    assert path.exists()

    restored, client2, _ = serve_ps(shard=1, checkpoint_path=path)
    assert restored.round == 4 and restored.version == 1
    reply, elapsed = timed(pull, client2, 4, 5.0)
    assert elapsed < 1.0 and reply.round == 4 and reply.version == 1
    assert_batch_equal(codec.decode_named(reply.tensors, reply.body), ps_values())
    assert ps_round(client2) == 4
    publish(client2, 3)  # still never backwards after a restore
    assert restored.round == 4


def test_shutdown_wakes_a_long_polling_pull(serve_ps):
    ps, client, connect = serve_ps()
    assign(client, ps_values())
    thread, box = in_thread(pull, client, 1, 5.0)
    time.sleep(0.3)
    assert thread.is_alive()
    stopped = time.monotonic()
    connect().call("Shutdown", pb.ShutdownRequest())
    thread.join(timeout=4)
    assert not thread.is_alive() and "error" not in box, box
    assert stopped <= box["at"] < stopped + 1.5
    assert box["result"].round == 0
    reply, elapsed = timed(pull, client, 1, 5.0)  # later long polls answer at once too
    assert elapsed < 1.0 and reply.round == 0
    assert publish(client, 1).stopping


# --- ShardedWeights.wait_round ---------------------------------------------------------


@pytest.fixture
def two_shards(serve_ps):
    """Two PS shards, local variables a (shard 0) and b (shard 1), initialized; returns
    (weights, variables, admin clients, shards)."""
    shards = [serve_ps(shard=0, stats=RunStats()), serve_ps(shard=1)]
    variables = {
        "a": tf.Variable(np.array([1.0, 2.0, 3.0], np.float32), name="a"),
        "b": tf.Variable(np.array([[-1.0, 0.5]], np.float32), name="b"),
    }
    weights = ShardedWeights([shard[1] for shard in shards], variables)
    assert weights.assignment == {"a": 0, "b": 1}
    assert weights.initialize()
    admin = [connect() for _, _, connect in shards]
    return weights, variables, admin, [ps for ps, _, _ in shards]


def test_wait_round_loads_the_published_values(two_shards):
    weights, variables, admin, shards = two_shards
    stop = threading.Event()
    thread, box = in_thread(weights.wait_round, 1, stop)
    time.sleep(0.3)
    assert thread.is_alive()

    grad = np.array([1.0, -2.0, 0.5], np.float32)
    push = pb.PushRequest(version=1, gradients=codec.encode_named({"a": grad}))
    assert admin[0].call("Push", push).applied
    new_b = np.array([[7.0, -8.0]], np.float32)
    assert assign(admin[1], {"b": new_b}, only_if_empty=False).assigned
    time.sleep(0.2)
    assert thread.is_alive()  # changed, but not published yet
    published = time.monotonic()
    for client in admin:
        publish(client, 1)
    thread.join(timeout=5)
    assert not thread.is_alive() and "error" not in box, box
    assert box["result"] is True
    assert published <= box["at"] < published + 2.5
    np.testing.assert_allclose(
        variables["a"].numpy(), np.array([1.0, 2.0, 3.0], np.float32) - 0.1 * grad, rtol=1e-6
    )
    np.testing.assert_array_equal(variables["b"].numpy(), new_b)
    assert weights.round == 1 and weights.local_versions == [2, 2]
    assert [ps.round for ps in shards] == [1, 1]


def test_wait_round_returns_false_when_stopped(two_shards):
    weights, variables, admin, _ = two_shards
    stop = threading.Event()
    stop.set()
    result, elapsed = timed(weights.wait_round, 1, stop)
    assert result is False and elapsed < 0.5
    assert weights.round == 0
    np.testing.assert_array_equal(variables["a"].numpy(), [1.0, 2.0, 3.0])


def test_wait_round_needs_every_shard_and_stops_while_waiting(two_shards):
    weights, variables, admin, _ = two_shards
    assert assign(admin[0], {"a": np.zeros(3, np.float32)}, only_if_empty=False).assigned
    publish(admin[1], 1)  # only shard 1 publishes round 1
    stop, waits = threading.Event(), []

    def on_wait():
        waits.append(time.monotonic())
        stop.set()

    result, elapsed = timed(weights.wait_round, 1, stop, on_wait)
    assert result is False and len(waits) == 1
    assert elapsed < 3.0
    assert weights.round == 0  # the smallest round any shard has published
    np.testing.assert_array_equal(variables["a"].numpy(), [1.0, 2.0, 3.0])  # nothing loaded


def test_restarted_shard_answers_incomplete_and_the_next_round_is_whole(serve_rounds):
    memory, client, _ = serve_rounds(capacity=16, round_size=4)
    memory.table._restarted = True  # as `build(restarted=True)` makes it after a restart
    insert(client, items(0, 4), 5)  # what one actor ships after the restart
    reply = take(client, 5, timeout_s=0.2)
    assert not reply.ready and reply.incomplete and reply.round == 5 and not reply.tensors
    assert memory.table.size == 4  # nothing is released or dropped by the answer
    insert(client, items(10, 4), 6)  # the learner abandoned round 5 and published 6
    reply = take(client, 6)
    assert reply.ready and not reply.incomplete
    assert_batch_equal(codec.decode_batch(reply.tensors, reply.body), items(10, 4))


def test_build_marks_a_restarted_aggregate_shard(tmp_path):
    cfg = from_dict({"algorithm": {"name": "ppo"}, "env": {"num_envs": 2}})
    cluster = SimpleNamespace(actor=2, memory=("h:1",))
    spec = {"obs": ((4,), np.float32)}
    for restarted in (False, True):
        memory = memory_role.build(cfg, spec, 0, cluster, restarted=restarted)
        try:
            memory.table.catch_up(1)
            assert memory.table.incomplete_round == (1 if restarted else None)
        finally:
            memory.close()
