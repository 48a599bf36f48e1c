"""The memory shard's write-ahead log (easyrl.roles.wal): records, torn and corrupt tails,
replay over a snapshot through real gRPC, and a shard process killed mid-burst."""

import os
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import lz4.block
import numpy as np
import pytest
import yaml
from conftest import Served

from easyrl.envs import env_spaces
from easyrl.errors import ReplayError, TransportError
from easyrl.replay import (
    LimitedTable,
    PrioritizedTable,
    RateLimiter,
    Table,
    TableSpec,
    UniformTable,
)
from easyrl.replay.frames import FrameLayout, FrameStore
from easyrl.roles import wal
from easyrl.roles.memory import MemoryServer, restore, restore_stored
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport.clients import MemoryClient

TOKEN = "wal-test-token"
SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}
HEADER = {"run": "test", "seed": 0, "shard": 0, "kind": "prioritized", "capacity": 64}
ROOT = Path(__file__).resolve().parents[1]


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Items whose columns derive from their number `start + i`."""
    k = np.arange(start, start + n)
    return {
        "obs": (k[:, None] + np.arange(4)[None, :] / 4).astype(np.float32),
        "action": k.astype(np.int64),
        "reward": (k * 0.5).astype(np.float32),
    }


def write_log(directory: Path, records: list[wal.Record], segment: int = 0) -> Path:
    log = wal.WriteAheadLog(directory, HEADER, segment, "write")
    for record in records:
        log.write(record)
    log.close()
    return wal.segment_path(directory, segment)


def replay_all(directory: Path, start: int = 0) -> tuple[wal.Replayed, list[int]]:
    """Replays the log; returns what replay counted and the first item of each insert."""
    firsts = []

    def apply(kind: int, payload: memoryview) -> int:
        request = codec.parser(pb.InsertRequest)(bytes(payload))
        firsts.append(int(codec.decode_batch(request.tensors, request.body)["action"][0]))
        return len(codec.decode_batch(request.tensors, request.body)["action"])

    return wal.replay(directory, HEADER, start, apply), firsts


def inserts(count: int, n: int = 3) -> list[wal.Record]:
    return [wal.insert_record(make_batch(i * n, n), None, 0, 0, 7, i + 1) for i in range(count)]


# --- records, torn and corrupt tails ---------------------------------------------------------


def test_a_torn_record_at_the_tail_is_dropped_counted_and_cut_off(tmp_path):
    path = write_log(tmp_path, inserts(5))
    whole = path.stat().st_size
    torn = wal.insert_record(make_batch(100, 3), None, 0, 0, 7, 6)
    with path.open("ab") as f:  # a kill in the middle of writing the sixth record
        f.write((torn.frame() + torn.payload)[:40])
    replayed, firsts = replay_all(tmp_path)
    assert firsts == [0, 3, 6, 9, 12] and replayed.items == 15
    assert replayed.dropped_bytes == 40 and path.stat().st_size == whole
    again, _ = replay_all(tmp_path)  # cut back: the next restart finds a whole log
    assert again.dropped_bytes == 0 and again.inserts == 5 and again.next_segment == 1


def test_a_corrupt_record_ends_the_log_and_sets_the_later_segments_aside(tmp_path):
    path = write_log(tmp_path, inserts(5))
    later = write_log(tmp_path, inserts(2), segment=1)
    data = bytearray(path.read_bytes())
    sizes = [len(r.frame()) + len(r.payload) for r in inserts(5)]
    third = len(data) - sum(sizes[2:])  # where the third insert record starts
    data[third + 20] ^= 0xFF  # a flipped bit in its payload: its CRC no longer matches
    path.write_bytes(bytes(data))
    later_size = later.stat().st_size
    replayed, firsts = replay_all(tmp_path)
    assert firsts == [0, 3]  # the records before the corrupt one, nothing after
    assert replayed.dropped_bytes == sum(sizes[2:]) + later_size
    assert path.stat().st_size == third and not later.exists()
    assert later.with_suffix(".dropped").exists()


def test_a_log_of_another_run_or_table_is_refused(tmp_path):
    write_log(tmp_path, inserts(1))
    for key, value in (("run", "other"), ("capacity", 128)):
        with pytest.raises(ReplayError, match=f"another run or table.*{key}"):
            wal.replay(tmp_path, {**HEADER, key: value}, 0, lambda kind, payload: 0)


def test_the_segments_a_snapshot_covers_are_skipped_and_deleted(tmp_path):
    write_log(tmp_path, inserts(2))
    write_log(tmp_path, inserts(1), segment=1)
    replayed, firsts = replay_all(tmp_path, start=1)
    assert firsts == [0] and replayed.segments == 1 and wal.segments(tmp_path) == [1]


# --- a shard restarted from its snapshot and its log, over gRPC ------------------------------


def prioritized() -> LimitedTable:
    return LimitedTable(PrioritizedTable(SPEC, 64, alpha=0.6, seed=1), RateLimiter(1), 4)


def queue() -> LimitedTable:
    table = Table.queue(SPEC, 64)
    return LimitedTable(table, RateLimiter.queue(table), 16)


class Shard:
    """A memory shard with a log behind real gRPC; `restart` drops it without a final
    snapshot (as a kill would, the writer having written what it answered) and builds it
    again from its snapshot and log, as `roles.memory.build` does."""

    def __init__(self, tmp_path: Path, make_table):
        self.path, self.make_table = tmp_path / "memory-0.npz", make_table
        self.served = Served()
        self.start()

    def start(self) -> None:
        self.table = self.make_table()
        restore(self.table, self.path)
        stored = restore_stored(self.path)
        log, self.replayed = wal.open_log(self.path, HEADER, self.table, stored, "group")
        self.memory = MemoryServer(self.table, 2, 0, stored, log)
        self.client = self.served.start("memory", self.memory, TOKEN, TOKEN)

    def restart(self) -> None:
        self.memory.close()
        assert self.memory.log is not None
        self.memory.log.close()
        self.start()

    def insert(self, start: int, n: int, sequence: int) -> pb.InsertResponse:
        request = pb.InsertRequest(actor=3, sender=9, sequence=sequence)
        request.tensors.extend(codec.encode_batch(make_batch(start, n)))
        return self.client.call("Insert", request)

    def close(self) -> None:
        self.memory.close()
        self.served.close()


@pytest.fixture
def shard(tmp_path):
    made = []

    def make(make_table):
        made.append(Shard(tmp_path, make_table))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_restarted_shard_has_its_snapshot_and_log_and_knows_a_resent_insert(shard):
    s = shard(prioritized)
    assert s.insert(0, 10, sequence=1).inserted == 10
    s.memory.snapshot(s.path)
    assert wal.segments(s.path.with_suffix(".wal")) == [1]  # the snapshot covers segment 0
    assert s.insert(10, 6, sequence=2).inserted == 16
    MemoryClient(s.client).update_priorities(np.array([2, 12, 13]), np.array([5.0, 0.5, 9.0]))
    before = s.table.state_dict()
    s.restart()
    assert (s.replayed.inserts, s.replayed.items, s.replayed.updates) == (1, 6, 1)
    after = s.table.state_dict()
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    reply = s.insert(10, 6, sequence=2)  # its reply was lost in the kill: sent again
    assert reply.duplicate and s.table.size == 16
    assert not s.insert(16, 2, sequence=3).duplicate and s.table.size == 18


def test_a_restarted_queue_does_not_give_back_what_it_gave_out(shard):
    s = shard(queue)  # learners' batches of 16: nothing prefetched from 8 items
    s.insert(0, 8, sequence=1)
    taken = MemoryClient(s.client).sample(3, 2.0)  # a batch of 3: not the prefetched size
    assert taken is not None and list(taken.data["action"]) == [0, 1, 2]
    s.restart()
    assert s.replayed.removes == 3 and s.table.size == 5
    taken = MemoryClient(s.client).sample(5, 2.0)
    assert taken is not None and list(taken.data["action"]) == [3, 4, 5, 6, 7]


def test_a_log_that_cannot_write_answers_nothing_and_stops_the_shard(shard):
    s = shard(prioritized)
    assert s.memory.log is not None

    def full_disk(parts):
        raise OSError(28, "No space left on device")

    s.memory.log._writev = full_disk  # the next write fails
    with pytest.raises(TransportError, match="write-ahead log failed"):
        s.insert(0, 2, sequence=1)
    assert s.memory.stopping.is_set()


def test_a_restarted_ring_samples_what_it_holds_without_waiting_for_new_inserts(tmp_path):
    from easyrl import config as config_lib
    from easyrl.algorithms import registry
    from easyrl.roles import memory as memory_role

    raw = yaml.safe_load((ROOT / "configs" / "cartpole_apex.yaml").read_text())
    raw["replay"].update(min_size_to_sample=50, samples_per_insert=None, error_buffer=None)
    cfg = config_lib.from_dict(raw)
    spec = registry.replay_spec(cfg, *env_spaces("CartPole-v1"))
    path = tmp_path / "memory-0.npz"
    first = memory_role.build(cfg, spec, 0, snapshot=path)
    assert isinstance(first.table, LimitedTable) and first.log is not None
    request = pb.InsertRequest(actor=1)
    request.tensors.extend(
        codec.encode_batch({k: np.zeros((40, *shape), dtype) for k, (shape, dtype) in spec.items()})
    )
    request.priorities.CopyFrom(codec.encode_array("priorities", np.ones(40, np.float32)))
    first.Insert(request, None)
    first.snapshot(path)  # 40 items in the snapshot
    first.Insert(request, None)  # 40 more in the log only
    first.close()
    first.log.close()
    again = memory_role.build(cfg, spec, 0, snapshot=path, restarted=True)
    try:
        assert isinstance(again.table, LimitedTable) and again.table.size == 80
        assert again.table.limiter.can_sample(1)  # 80 held >= min_size_to_sample 50
    finally:
        again.close()
        assert again.log is not None
        again.log.close()


# --- Atari frames stay stored once in the log -------------------------------------------------


def test_the_log_keeps_an_atari_shipment_frame_by_frame(tmp_path):
    k, frame = 4, (84, 84, 1)
    spec = {
        "obs": ((84, 84, k), np.uint8),
        "next_obs": ((84, 84, k), np.uint8),
        "action": ((), np.int64),
    }
    layout = FrameLayout.find(spec, (84, 84, k), k, np.uint8)
    assert layout is not None
    table = LimitedTable(
        UniformTable(spec, 256, frames=FrameStore(layout, 1024)), RateLimiter(1), 4
    )
    # One env's stream of 32 transitions, 3 steps apart: 35 distinct frames.
    frames = np.random.default_rng(0).integers(0, 255, (40, *frame), dtype=np.uint8)
    stacks = np.stack([np.concatenate(frames[i : i + k], axis=-1) for i in range(36)])
    batch = {"obs": stacks[:32], "next_obs": stacks[3:35], "action": np.arange(32)}
    packed, n = table.check_insert(layout.pack(batch), None, 0)
    record = wal.insert_record(packed, None, 0, 0, 1, 1)
    whole = sum(v.nbytes for v in batch.values())
    assert len(record.payload) < 1.1 * (35 + 3) * 84 * 84  # about the distinct frames
    assert len(record.payload) < whole / 6


def test_a_compressible_atari_shipment_is_logged_compressed_and_replayed_whole(tmp_path):
    k, frame = 4, (42, 42, 1)
    u8 = np.dtype(np.uint8)
    spec: TableSpec = {"obs": ((42, 42, k), u8), "next_obs": ((42, 42, k), u8)}
    layout = FrameLayout.find(spec, (42, 42, k), k, np.uint8)
    assert layout is not None

    def table() -> LimitedTable:
        return LimitedTable(
            UniformTable(spec, 64, frames=FrameStore(layout, 256)), RateLimiter(1), 4
        )

    # Frames as a game draws them: a flat background with a few moving objects.
    frames = np.full((40, *frame), 87, np.uint8)
    for i in range(40):
        frames[i, 5 + i % 30 : 9 + i % 30, 10:13] = 236
    stacks = np.stack([np.concatenate(frames[i : i + k], axis=-1) for i in range(36)])
    batch = {"obs": stacks[:32], "next_obs": stacks[3:35]}
    packed, _ = table().check_insert(layout.pack(batch), None, 0)
    record = wal.insert_record(packed, None, 0, 0, 1, 1)
    assert record.kind == wal.INSERT_LZ4
    assert len(record.payload) * 10 < 35 * 42 * 42  # the 35 distinct frames, raw
    # Noise does not compress: it is logged as it is.
    noise = {"obs": np.random.default_rng(0).integers(0, 255, (32, 42, 42, k), np.uint8)}
    assert wal.insert_record({**noise, "next_obs": noise["obs"]}, None, 0, 0, 1, 2).kind == (
        wal.INSERT
    )

    # A log written before LZ4 (zlib records) still replays.
    old = wal.Record(wal.INSERT_ZLIB, zlib.compress(lz4.block.decompress(record.payload)))
    for name, written in [("lz4", record), ("zlib", old)]:
        write_log(tmp_path / name, [written])
        restored = table()
        replayed = wal.replay(tmp_path / name, HEADER, 0, wal.applier(restored, {}))
        assert (replayed.inserts, replayed.items) == (1, 32)
        direct = table()  # the same shipment stored without a log in between
        direct.table.insert(packed, None, source=0)
        want, got = direct.state_dict(), restored.state_dict()
        assert sorted(want) == sorted(got)
        for key, value in want.items():
            np.testing.assert_array_equal(got[key], value, err_msg=key)


# --- a memory shard process SIGKILLed in the middle of an insert burst ------------------------

DQN_SPEC = {  # configs/cartpole_apex.yaml's items (dqn's replay_spec on CartPole)
    "obs": ((4,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((4,), np.float32),
    "discount": ((), np.float32),
}
ITEMS = 16  # per insert


def numbered(actor: int, sequence: int) -> dict[str, np.ndarray]:
    """The items of `actor`'s insert `sequence`, each named by its `action`."""
    batch: dict[str, np.ndarray] = {
        k: np.zeros((ITEMS, *shape), dtype) for k, (shape, dtype) in DQN_SPEC.items()
    }
    batch["action"] = actor * 10_000_000 + sequence * 100 + np.arange(ITEMS)
    return batch


class Burst:
    """Actors inserting numbered batches as fast as the shard answers, each remembering the
    last insert the shard acknowledged (the next one was in flight when it stopped)."""

    def __init__(self, address: str, actors: int):
        from easyrl.transport import rpc

        self.clients = [
            MemoryClient(
                rpc.Client(rpc.stub_class("memory"), address, TOKEN, timeout_s=5.0, retry_s=0)
            )
            for _ in range(actors)
        ]
        self.acked = [0] * actors
        self.threads = [threading.Thread(target=self.run, args=(a,)) for a in range(actors)]
        for thread in self.threads:
            thread.start()

    def run(self, actor: int) -> None:
        client = self.clients[actor]
        while True:
            sequence = self.acked[actor] + 1
            try:
                client.insert(numbered(actor, sequence), None, actor, 0, 100 + actor, sequence)
            except TransportError:
                return  # the shard is gone; this insert may or may not be stored
            self.acked[actor] = sequence

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()
        for client in self.clients:
            client.close()


def memory_process(config: Path, ps: str, memory: str, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "easyrl.cli", "run", "--role", "memory", "--task", "0"]
    command += ["--config", str(config), "--ps-hosts", ps, "--memory-hosts", memory]
    command += ["--num-learners", "1", "--num-actors", "4"]
    env = {**os.environ, "EASYRL_TOKEN": TOKEN}
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_until(predicate, what: str, process: subprocess.Popen, log_path: Path) -> None:
    for _ in range(1200):  # a hang guard (2 min), not a timing assertion
        if predicate():
            return
        assert process.poll() is None, log_path.read_text()
        threading.Event().wait(0.1)
    raise AssertionError(f"never: {what}\n{log_path.read_text()}")


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_every_insert_a_killed_shard_acknowledged_is_sampled_after_its_restart(tmp_path):
    from easyrl.cluster.launcher import free_ports
    from easyrl.transport import rpc

    raw = yaml.safe_load((ROOT / "configs" / "cartpole_apex.yaml").read_text())
    raw["run"] = {**raw["run"], "dir": str(tmp_path / "run"), "checkpoint_interval_s": 1.0}
    raw["replay"].update(
        capacity=100_000, min_size_to_sample=1, samples_per_insert=None, error_buffer=None
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    ps, address = (f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2))
    snapshot = tmp_path / "run" / "checkpoints" / "memory-0.npz"
    log_path = tmp_path / "memory.log"
    log = log_path.open("w")
    process = memory_process(config, ps, address, log)
    burst = None
    client = rpc.Client(rpc.stub_class("memory"), address, TOKEN, timeout_s=5.0, retry_s=120)
    try:
        client.call("Status", pb.StatusRequest())  # listening
        burst = Burst(address, actors=4)
        # Killed mid-burst, after a snapshot (the log is replayed over it) and some inserts.
        wait_until(snapshot.exists, "a snapshot", process, log_path)
        acked_then = sum(burst.acked)
        wait_until(lambda: sum(burst.acked) > acked_then + 200, "inserts", process, log_path)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        burst.join()
        acked = list(burst.acked)
        process = memory_process(config, ps, address, log)
        memory = MemoryClient(client)
        for actor, last in enumerate(acked):  # each actor resends the insert it had in flight
            memory.insert(numbered(actor, last + 1), None, actor, 0, 100 + actor, last + 1)
        expected = {
            int(k) for a, last in enumerate(acked) for s in range(1, last + 2)
            for k in numbered(a, s)["action"]
        }  # fmt: skip
        status = dict(client.call("Status", pb.StatusRequest()).counters)
        assert status["memory/0/size"] == len(expected)  # each insert stored exactly once
        assert status["memory/0/wal_replayed_items"] > 0
        seen: set[int] = set()
        for _ in range(2000):  # sampled with replacement: until every item came back
            taken = memory.sample(4096, 5.0)
            assert taken is not None
            seen.update(int(k) for k in taken.data["action"])
            if seen >= expected:
                break
        assert seen == expected
    finally:
        client.close()
        if burst is not None:
            for thread in burst.threads:
                thread.join(60)
        process.kill()
        process.wait(30)
        log.close()
    assert "write-ahead log" in log_path.read_text()
