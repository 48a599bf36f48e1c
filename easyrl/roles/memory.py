"""Replay-memory shard: one table, owned by one thread, behind a gRPC service.

gRPC handler threads validate requests and hand them to the table thread as typed
operations (`Op`); the table thread is the only code that touches the table (no locks on
the table). Operations the table does not admit yet (its rate limiter, a round not yet
complete) wait in a pending list until they are admitted or their deadline passes. The
table thread also keeps a small queue of ready, already-encoded sample batches so a
learner's Sample call usually returns without waiting for the table.

The server holds its table through one interface, `replay.ServedTable`, whatever the
replay kind (`replay.kinds`: a ring or a queue with its rate limiter, the aggregate table
of synchronous rounds, or a kind of your own); `build` asks the config's kind to make it.
With Atari frame stacks (`replay.frames.layout_for`) a table stores each frame once:
actors ship the wire form (`FrameLayout.pack`), an Insert of whole stacks is packed by its
handler thread, and Sample returns whole stacks as before.

An offline run (`input.dir`) fills a uniform table from the dataset at start (see
`load_dataset`) and only serves samples: no inserts come, so the rate limiter asks for
nothing but a non-empty table, and no snapshot is taken (the dataset is the snapshot).

This module does not import TensorFlow.
"""

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np

from easyrl.atomic import save_npz
from easyrl.errors import RateLimitTimeout, ReplayError
from easyrl.replay import (
    LimitedTable,
    NotReady,
    RateLimiter,
    Sampled,
    ServedTable,
    Table,
    UniformTable,
    item_bytes,
    kinds,
    validate_batch,
)
from easyrl.replay.frames import layout_for
from easyrl.replay.storage import DATA_PREFIX
from easyrl.roles import wal
from easyrl.seeds import derive_seed
from easyrl.transport import codec, local, shm
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import easyrl_pb2_grpc as pb_grpc
from easyrl.transport.rpc import caller_active, invalid_argument_on_error, within_deadline

log = logging.getLogger(__name__)
STORED_KEY = "inserts/stored"
"""The snapshot's [actor, sender, last sequence] rows (see `MemoryServer._state`)."""
INSERT_WAIT_S = 0.5
"""How long an Insert the rate limiter (or a full queue) holds back waits here before it is
refused (RESOURCE_EXHAUSTED): the actor sends it again, and in between asks whether the run
is stopping, so once the learners stop its actors exit within about this long (a resend
costs the shard a decode, about two a second per held-back actor)."""
IDLE_WAIT_S = 0.05
"""The longest the table thread waits for an operation before it tries the pending ones
again (a caller gone, a kind of table that admits on a clock)."""


def _always() -> bool:
    return True


@dataclass
class Op:
    """One request for the table thread: its kind, how long it may wait for the table to
    admit it, and what its kind uses (the others keep their defaults): `batch` (insert),
    `priorities` (insert, update; None: the table's default), `keys` (update), `n` (items
    inserted, sampled or updated; 0 for a whole round), `round` (insert, sample: a table of
    rounds), `source` (insert: the actor that sent it), `sender` and `sequence` (insert:
    exactly-once, see `InsertRequest`), `active` (whether the caller still waits:
    nothing is stored or released for one that is gone), `record` (insert, update: its
    write-ahead log record, when the shard keeps a log) and `logged` (set by the table
    thread: the log position the insert's answer waits to be durable)."""

    kind: Literal["insert", "sample", "update", "snapshot"]
    timeout_s: float
    batch: dict[str, np.ndarray] = field(default_factory=dict)
    priorities: np.ndarray | None = None
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    n: int = 0
    round: int = 0
    source: int = 0
    sender: int = 0
    sequence: int = 0
    active: Callable[[], bool] = _always
    record: Any = None
    logged: int = 0
    deadline: float = field(init=False)
    future: Future = field(default_factory=Future)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s


class MemoryServer(pb_grpc.ReplayMemoryServicer):
    """A replay shard.

    Args:
        table: the served table (`replay.kinds.Kind.build`: a `replay.LimitedTable`, an
            aggregate table of rounds or one of your own).
        prefetch: how many ready batches to keep (a table that prefetches).
        shard: this shard's index (for status).
        stored: {actor: (sender, last sequence)} of the inserts stored before a restart
            (`restore_stored`): their resends are known as duplicates.
        log: the shard's write-ahead log (`easyrl.roles.wal`; None: none): inserts and
            priority updates are answered once their records are durable.

    `shared` (set by the role when it serves, None: none) writes the sampled batches of
    callers on this host into their shared-memory segments (`easyrl.transport.shm`).
    """

    def __init__(
        self,
        table: ServedTable,
        prefetch: int = 1,
        shard: int = 0,
        stored: dict[int, tuple[int, int]] | None = None,
        log: wal.WriteAheadLog | None = None,
    ):
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        self.table = table
        self.shard = shard
        self._ops: queue.Queue[Op | None] = queue.Queue()
        self._ready: queue.Queue[codec.Framed] = queue.Queue(maxsize=prefetch)
        self._pending: collections.deque[Op] = collections.deque()
        self.counters = collections.Counter()
        # actor: (sender, last sequence stored); a restarted shard's from its snapshot
        self._stored: dict[int, tuple[int, int]] = dict(stored or {})
        self.stopping = threading.Event()
        self.log = log
        self.shared: shm.Attached | None = None
        self._removes = log is not None and wal.removes_on_sample(table)
        if log is not None:  # a log that cannot write answers nothing more: stop the shard
            log.on_error = lambda err: self.stopping.set()
        self._thread = threading.Thread(target=self._table_loop, name="table", daemon=True)
        self._thread.start()

    # --- table thread ----------------------------------------------------------------

    def _take_ops(self, wait_s: float) -> None:
        """Moves queued operations to the pending list, waiting up to `wait_s` for the
        first. A None in the queue only wakes the thread (a prefetched batch was taken)."""
        try:
            ops = [self._ops.get(timeout=wait_s)]
        except queue.Empty:
            return
        while True:
            try:
                ops.append(self._ops.get_nowait())
            except queue.Empty:
                break
        self._pending.extend(op for op in ops if op is not None)

    def _table_loop(self) -> None:
        """Runs the operations: a pending one is tried again as soon as another changed the
        table (an insert, a sample, a prefetched batch taken), at its deadline, and at
        least every `IDLE_WAIT_S`. Not on a 2 ms clock, as before: with 1, 16 and 64
        inserts held back, that poll took 0.035-0.135 cores of a shard doing nothing else,
        this 0.005-0.05 (`benchmarks/bench_waiting.py`)."""
        changed = False
        while not self.stopping.is_set():
            self._take_ops(0.0 if changed else self._wait_s())
            ran = self._run_pending()
            changed = self._fill_prefetch() or ran
        for op in self._pending:
            op.future.set_exception(ReplayError("memory shard is shutting down"))

    def _wait_s(self) -> float:
        """How long the table thread may wait for a new operation: `IDLE_WAIT_S`, less up
        to the first pending deadline."""
        if not self._pending:
            return IDLE_WAIT_S
        first = min(op.deadline for op in self._pending)
        return min(IDLE_WAIT_S, max(0.0, first - time.monotonic()))

    def _run_pending(self) -> bool:
        """Tries every pending operation once, in order; returns whether any was answered
        (the table may then admit others)."""
        still = collections.deque()
        now = time.monotonic()
        answered = False
        for op in self._pending:
            try:
                result = self._try(op)
            except ReplayError as err:
                op.future.set_exception(err)
                continue
            if result is not None:
                self._answer(op, result)
                answered = True
            elif now >= op.deadline:
                self.counters[f"rate_limited_{op.kind}"] += 1
                op.future.set_exception(RateLimitTimeout(f"{op.kind} timed out (rate limiter)"))
            else:
                still.append(op)
        self._pending = still
        return answered

    def _answer(self, op: Op, result) -> None:
        """Answers `op`, writing its record first when the shard keeps a log. An insert
        learns the log position its handler syncs to before it answers (its record's, or
        for one not stored, such as a duplicate, all written so far: its original's); an
        update is answered without waiting for the fsync: a kill may lose the last
        milliseconds of them, not an item."""
        if self.log is not None and op.kind in ("insert", "update"):
            try:
                op.logged = self.log.write(op.record) if op.record else self.log.written
            except ReplayError as err:
                op.future.set_exception(err)
                return
        op.future.set_result(result)

    def _sampled(self, result):
        """`result` of a table sample; a queue's log keeps the items it removed."""
        if self._removes and isinstance(result, Sampled):
            assert self.log is not None
            self.log.write(wal.remove_record(len(next(iter(result.data.values())))))
        return result

    def _try(self, op: Op):
        """Runs `op` if the table admits it now; returns its result or None."""
        if op.kind == "insert":
            return self._insert(op)
        if op.kind == "sample":
            if not op.active():  # nothing is taken (a FIFO or a round would lose it)
                raise ReplayError("the caller gave up before the sample ran")
            result = self._sampled(self.table.try_sample(op.n, op.round))
            return None if result is None else self._reply(result)
        if op.kind == "snapshot":  # a copy taken between two operations: consistent
            return self._state()
        updated = self.table.update_priorities(op.keys, op.priorities)
        self.counters["priority_updates"] += updated
        self.counters["stale_priority_keys"] += op.n - updated
        return pb.UpdatePrioritiesResponse(updated=updated)

    def _insert(self, op: Op) -> pb.InsertResponse | None:
        table = self.table
        if self._duplicate(op):
            op.record = None  # answered after the original's record is durable
            return pb.InsertResponse(
                size=table.size, inserted=table.inserted, round=table.round, duplicate=True
            )
        if not op.active():  # the caller's deadline passed while the op waited: not stored
            self.counters["inserts_abandoned"] += op.n
            raise ReplayError("the caller gave up before the insert ran")
        kept = table.try_insert(op.batch, op.n, op.priorities, op.round, op.source)
        if kept is None:
            return None
        self._remember(op)
        if not kept:
            op.record = None
        self.counters["inserts" if kept else "refused_stale"] += op.n
        return pb.InsertResponse(
            size=table.size, inserted=table.inserted, refused=not kept, round=table.round
        )

    def _remember(self, op: Op) -> None:
        """Keeps the number of stored insert `op` when it has one (exactly-once)."""
        if op.sender:
            self._stored[op.source] = (op.sender, op.sequence)

    def _duplicate(self, op: Op) -> bool:
        """Whether insert `op` was stored before (exactly-once, see `InsertRequest`): counted
        as `duplicate_inserts` and answered without storing it again."""
        sender, sequence = self._stored.get(op.source, (0, 0))
        if op.sender == 0 or op.sender != sender or op.sequence > sequence:
            return False
        self.counters["duplicate_inserts"] += op.n
        return True

    def _reply(self, result: Sampled | NotReady) -> pb.SampleResponse | codec.Framed:
        """The Sample reply of a table's answer."""
        if isinstance(result, NotReady):
            return pb.SampleResponse(ready=False, round=result.round, incomplete=result.incomplete)
        return self._encode(result)

    def _encode(self, sampled: Sampled) -> codec.Framed:
        """A Sample reply of sampled items, encoded once, on this thread."""
        self.counters["samples"] += len(next(iter(sampled.data.values())))
        body = codec.Body()
        extra = {}  # keys and weights of a sample that has them (not a whole round)
        if len(sampled.keys):
            extra["keys"] = body.tensor("keys", sampled.keys)
        if len(sampled.weights):
            extra["weights"] = body.tensor("weights", sampled.weights)
        tensors = body.batch(sampled.data)
        return body.frame(
            pb.SampleResponse(ready=True, tensors=tensors, round=sampled.round, **extra)
        )

    def _fill_prefetch(self) -> bool:
        """Samples ready batches until the prefetch queue is full or the table admits no
        more; returns whether it sampled any."""
        table = self.table
        if not table.prefetch:  # e.g. whole rounds, on request
            return False
        sampled = False
        while not self._ready.full():
            try:
                result = self._sampled(table.try_sample(table.batch_size, 0))
            except ReplayError as err:  # e.g. every stored priority is zero: retry later
                log.debug("prefetch skipped: %s", err)
                break
            if not isinstance(result, Sampled):
                break
            self._ready.put_nowait(self._encode(result))
            sampled = True
        return sampled

    def _submit(self, op: Op):
        if self.stopping.is_set():
            raise ReplayError("memory shard is shutting down")
        self._ops.put(op)
        while True:
            try:
                return op.future.result(timeout=0.1)
            except TimeoutError:
                # The table thread is gone (shutdown): nobody will ever answer this op.
                if not self._thread.is_alive() and not op.future.done():
                    raise ReplayError("memory shard is shutting down") from None
                # The caller gave up (deadline, cancel): free this handler thread now; the
                # table thread drops the op without storing or releasing anything for it.
                if not op.active() and not op.future.done():
                    raise ReplayError("the caller is gone") from None

    # --- RPCs ------------------------------------------------------------------------

    @invalid_argument_on_error
    def Insert(self, request, context):
        body = shm.request_body(self.shared, request, self.counters)
        batch = codec.decode_batch(request.tensors, body)
        priorities = None
        if request.HasField("priorities"):
            priorities = codec.decode_array(request.priorities, body)
        timeout = within_deadline(context, INSERT_WAIT_S)
        batch, n = self.table.check_insert(batch, priorities, request.round)
        record = None
        if self.log is not None:  # the batch as the table takes it: Atari frames once
            record = wal.insert_record(
                batch, priorities, request.actor, request.round, request.sender, request.sequence
            )
        op = Op(
            "insert",
            timeout,
            batch=batch,
            priorities=priorities,
            n=n,
            round=request.round,
            source=request.actor,
            sender=request.sender,
            sequence=request.sequence,
            active=caller_active(context),
            record=record,
        )
        try:
            answer = self._submit(op)
        except RateLimitTimeout as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        if self.log is not None:  # answered once its record is durable
            self.log.sync(op.logged)
        return answer

    @invalid_argument_on_error
    def Sample(self, request, context):
        if not 0 <= request.timeout_s <= 600:
            raise ReplayError("timeout_s must be in [0, 600]")
        table = self.table
        table.check_sample(request.batch_size, request.round)
        # Waits end at the caller's deadline, or as soon as it cancels; never release
        # items to a caller that is gone: they would be lost.
        timeout, active = within_deadline(context, request.timeout_s), caller_active(context)
        if table.prefetch and request.batch_size == table.batch_size:
            return shm.shared_reply(
                self.shared, request.shm_name, self._prefetched(timeout, active), self.counters
            )
        op = Op("sample", timeout, n=request.batch_size, round=request.round, active=active)
        try:
            return shm.shared_reply(self.shared, request.shm_name, self._submit(op), self.counters)
        except RateLimitTimeout:
            return pb.SampleResponse(ready=False, round=table.round)

    def _prefetched(self, timeout: float, active: Callable[[], bool]):
        """A ready batch from the prefetch queue, waiting up to `timeout` for one."""
        deadline = time.monotonic() + timeout
        while active():
            try:
                batch = self._ready.get(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
                continue
            self._ops.put(None)  # wake the table thread to refill the prefetch queue
            return batch
        return pb.SampleResponse(ready=False)

    @invalid_argument_on_error
    def UpdatePriorities(self, request, context):
        keys = codec.decode_array(request.keys, request.body)
        priorities = codec.decode_array(request.priorities, request.body)
        if keys.ndim != 1 or keys.dtype.kind not in "iu" or priorities.shape != keys.shape:
            raise ReplayError("keys must be 1-D integers and priorities of the same shape")
        keys = keys.astype(np.int64)
        record = None if self.log is None else wal.update_record(keys, priorities)
        op = Op("update", 0.0, keys=keys, priorities=priorities, n=len(keys), record=record)
        return self._submit(op)

    def Status(self, request, context):
        snapshot = {
            **self.counters,  # copied: the table thread may add keys meanwhile
            **self.table.status(),
            **(self.log.stats if self.log is not None else {}),
            "size": self.table.size,
            "ready_batches": self._ready.qsize(),
        }
        counters = {f"memory/{self.shard}/{k}": float(v) for k, v in snapshot.items()}
        return pb.StatusResponse(
            role="memory",
            task=self.shard,
            stopping=self.stopping.is_set(),
            counters=counters,
        )

    def Shutdown(self, request, context):
        self.stopping.set()
        return pb.ShutdownResponse()

    def close(self) -> None:
        """Stops the table thread (and unmaps the callers' segments)."""
        self.stopping.set()
        self._thread.join(timeout=5)
        if self.shared is not None:
            self.shared.close()

    def _state(self) -> dict:
        """The table's state and the last insert stored from each actor (exactly-once
        across a restart of this shard: a resend of an insert it had stored is known)."""
        stored = [(source, *last) for source, last in self._stored.items()]
        state = self.table.state_dict()
        state[STORED_KEY] = np.array(stored, np.int64).reshape(-1, 3)
        if self.log is not None:  # the log's segments from here on are not in this state
            state[wal.WAL_KEY] = np.int64(self.log.rotate())
        return state

    def snapshot(self, path: Path) -> int:
        """Writes the table to `path` (write, then rename): copied by the table thread between
        two operations (inserts pause only for the copy), written by the caller. After
        `close` the table is read directly.

        Returns:
            The number of items saved.

        Raises:
            ReplayError: the table is not snapshotted (`Kind.snapshots`).
        """
        state = self._submit(Op("snapshot", 0.0)) if self._thread.is_alive() else self._state()
        save_npz(path, state, durable=self.log is not None)
        if self.log is not None:  # the snapshot is on disk: the segments it covers can go
            self.log.truncate(int(state[wal.WAL_KEY]))
        items = len(next(v for k, v in state.items() if k.startswith(DATA_PREFIX)))
        self.counters["snapshot_items"] = items
        return items


def restore(table: Table | ServedTable, path: Path) -> int:
    """Loads a snapshot written by `MemoryServer.snapshot` into a new table.

    Returns:
        The number of items restored (0 when there is no snapshot).

    Raises:
        ReplayError: the snapshot does not fit the table (another config); nothing changed.
    """
    if not path.exists():
        return 0
    with np.load(path) as data:
        names = [k for k in data.files if k not in (STORED_KEY, wal.WAL_KEY)]
        state = {k: data[k].item() if data[k].ndim == 0 else data[k] for k in names}
    table.load_state_dict(state)
    log.info("restored %d items from %s", table.size, path)
    return table.size


def restore_stored(path: Path) -> dict[int, tuple[int, int]]:
    """{actor: (sender, last sequence stored)} of a snapshot ({} without one, or from a
    snapshot written before they were kept)."""
    if not path.exists():
        return {}
    with np.load(path) as data:
        rows = data[STORED_KEY] if STORED_KEY in data.files else np.zeros((0, 3), np.int64)
    return {int(source): (int(sender), int(seq)) for source, sender, seq in rows}


def round_size(cfg, num_actors: int, num_memory: int, shard: int) -> int:
    """Items that complete a round on memory `shard`: the shares of the actors that ship
    to it (actor i ships to shard i % num_memory)."""
    from easyrl.algorithms import registry

    return sum(
        registry.round_share(cfg, i, num_actors) for i in range(shard, num_actors, num_memory)
    )


def load_dataset(cfg, spec, shard: int, num_memory: int) -> tuple[UniformTable, int]:
    """Builds memory `shard`'s table of an offline run: the dataset shards k with
    k % num_memory == shard, turned into items by the algorithm's `dataset_items`.

    Returns:
        (the filled uniform table, the number of dataset shards loaded).

    Raises:
        ReplayError: the share is empty or does not fit `replay.capacity`, or the items do
            not match the replay spec.
    """
    from easyrl.algorithms import registry
    from easyrl.offline.dataset import list_shards, read_steps

    directory = cfg.input.dir
    count = len(list_shards(directory))
    indices = list(range(shard, count, num_memory))
    if not indices:
        raise ReplayError(
            f"memory shard {shard} gets no shard of dataset {directory} (it has "
            f"{count}); use at most that many memory shards"
        )
    dataset_items = registry.spec(cfg.algorithm.name).dataset_items
    if dataset_items is None:  # the config refuses input.dir for such an algorithm
        raise ReplayError(f"{cfg.algorithm.name} cannot train from a dataset")
    items = dataset_items(cfg.algorithm.params, read_steps(directory, indices))
    n = validate_batch(spec, items)
    if n > cfg.replay.capacity:
        raise ReplayError(
            f"replay.capacity {cfg.replay.capacity} is too small for memory shard {shard}'s "
            f"share of the dataset ({n} items); raise replay.capacity to at least {n}"
        )
    table = UniformTable(spec, cfg.replay.capacity, seed=derive_seed(cfg.run.seed, "memory", shard))
    table.insert(items)
    log.info("memory shard %d loaded %d items from %d dataset shards", shard, n, len(indices))
    return table, len(indices)


def shard_setup(cfg, spec, shard: int, cluster=None, restarted: bool = False) -> kinds.ShardSetup:
    """What the config's replay kind takes to build memory `shard`'s table.

    Args:
        cfg: the run's config.
        spec: the table's column spec (from the algorithm's `replay_spec`).
        shard: this shard's index.
        cluster: the cluster spec (sizes the rounds of a kind whose learners take rounds).
        restarted: this shard ran before in this run directory.
    """
    kind = kinds.get(cfg.replay.kind)

    def items_per_round() -> int:
        if cluster is None:
            raise ReplayError(f"replay.kind {kind.name!r} needs the cluster to size its rounds")
        return round_size(cfg, cluster.actor, len(cluster.memory), shard)

    return kinds.ShardSetup(
        replay=cfg.replay,
        spec=spec,
        seed=derive_seed(cfg.run.seed, "memory", shard),
        batch_size=cfg.algorithm.params.batch_size if kind.batches else 0,
        batches_per_sample=cfg.learner.batches_per_sample if kind.batches else 1,
        num_envs=cfg.env.num_envs,
        send_every=cfg.actor.send_every,
        frames=layout_for(cfg, spec),
        round_size=items_per_round,
        restarted=restarted,
    )


def share_memory(memory: MemoryServer, cfg, token: str | None) -> None:
    """Lets `memory` write the sampled batches of callers on its host into their segments
    (`easyrl.transport.shm`; the run of `token`), unless `cluster.shared_memory` is false."""
    if cfg.cluster.shared_memory:
        memory.shared = shm.Attached(shm.run_prefix(token))


def build(
    cfg, spec, shard: int, cluster=None, snapshot: Path | None = None, restarted: bool = False
) -> MemoryServer:
    """Builds a memory shard from the config's `replay` section and a table spec: the
    table of its replay kind (`replay.kinds`), restored from `snapshot` when the kind
    snapshots and the file exists.

    Args:
        cfg: the run's config.
        spec: the table's column spec (from the algorithm's `replay_spec`).
        shard: this shard's index.
        cluster: the cluster spec (needed by a table of rounds to size them).
        snapshot: the shard's snapshot file.
        restarted: this shard ran before in this run directory (a table of rounds then
            marks its first round incomplete).
    """
    r = cfg.replay
    if cfg.input.dir is not None:  # offline: the dataset's items, sampling only
        num_memory = len(cluster.memory) if cluster is not None else 1
        table, shards = load_dataset(cfg, spec, shard, num_memory)
        limiter = RateLimiter.min_size(min(r.min_size_to_sample, table.size))
        limiter.on_insert(table.size)  # before the table thread starts reading it
        batch = cfg.algorithm.params.batch_size * cfg.learner.batches_per_sample
        served = LimitedTable(table, limiter, batch)
        memory = MemoryServer(served, r.prefetch, shard)
        memory.counters.update(loaded_items=table.size, loaded_shards=shards)
        return memory
    kind = kinds.get(r.kind)
    setup = shard_setup(cfg, spec, shard, cluster, restarted)
    served = kind.build(setup)
    if not kind.snapshots or snapshot is None:
        return MemoryServer(served, r.prefetch, shard)
    restored, stored = restore(served, snapshot), restore_stored(snapshot)
    log_, replayed, started = None, wal.Replayed(), time.monotonic()
    if r.wal != "none":
        header = wal.identity(cfg, spec, shard, setup.frames is not None)
        log_, replayed = wal.open_log(snapshot, header, served, stored, r.wal, r.wal_sync_ms / 1e3)
        log.info(
            "memory shard %d: %d items from its snapshot, then %d inserts (%d items), %d "
            "priority updates and %d queue removals from its write-ahead log in %.2f s "
            "(%d bytes of a torn or corrupt tail dropped; not kept: a ring's sampling state)",
            shard, restored, replayed.inserts, replayed.items, replayed.updates,
            replayed.removes, time.monotonic() - started, replayed.dropped_bytes,
        )  # fmt: skip
    if isinstance(served, LimitedTable) and not served.table.remove_on_sample and served.size:
        # What a ring holds again counts as inserted for its rate limiter: a restarted shard
        # serves samples at once, not after min_size_to_sample new inserts (a queue's
        # limiter counts the queue itself).
        served.limiter.on_insert(served.size)
    memory = MemoryServer(served, r.prefetch, shard, stored, log_)
    # What the restored table counts as acknowledged (its `inserted` once restored).
    memory.counters.update(restored_items=restored, restored_inserted=served.inserted)
    memory.counters.update(
        wal_replayed_items=replayed.items, wal_dropped_bytes=replayed.dropped_bytes
    )
    return memory


def largest_message(cfg, spec: dict, memory: MemoryServer) -> int:
    """Bytes of the largest message shard `memory` legitimately takes or sends: an actor's
    Insert (at most one item per env and vector step between shipments, or its round
    share), a Sample reply (`batch_size` items: a learner's batch or a round taken whole);
    items as the spec sizes them (Atari stacks whole: an Insert of distinct frames is
    smaller)."""
    items = max(cfg.env.num_envs * cfg.actor.send_every, memory.table.batch_size)
    return items * item_bytes(spec)


def snapshot_path(run_dir: Path, shard: int) -> Path:
    """Memory `shard`'s snapshot file in `run_dir`; its write-ahead log is beside it
    (`wal.log_dir`)."""
    return run_dir / "checkpoints" / f"memory-{shard}.npz"


def run(ctx) -> int:
    """Runs memory shard `ctx.task` until Shutdown or SIGTERM."""
    from easyrl.algorithms import registry
    from easyrl.metrics import prometheus
    from easyrl.roles.common import stop_event_on_signals
    from easyrl.transport.rpc import add_servicer, make_server

    stop = stop_event_on_signals()
    obs_space, action_space = ctx.spaces()
    spec = registry.replay_spec(ctx.cfg, obs_space, action_space)
    path = snapshot_path(ctx.run_dir, ctx.task)
    marker = path.with_suffix(".started")  # left by an earlier process of this shard
    restarted = marker.exists()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    memory = build(ctx.cfg, spec, ctx.task, ctx.cluster, snapshot=path, restarted=restarted)
    share_memory(memory, ctx.cfg, ctx.token)
    snapshots = kinds.get(ctx.cfg.replay.kind).snapshots and ctx.cfg.input.dir is None
    # Every actor keeps one Insert in flight, and one the rate limiter holds back occupies
    # a handler thread: enough threads that learners' Samples never queue behind them.
    workers = 16 + ctx.cluster.actor + 4 * ctx.cluster.learner
    server, _ = make_server(
        ctx.cluster.memory[ctx.task],
        ctx.token,
        max_workers=workers,
        tls=ctx.tls(),
        max_message_bytes=ctx.message_limit(largest_message(ctx.cfg, spec, memory)),
    )
    add_servicer("memory", memory, server)
    server.start()
    calls = local.serve("memory", memory, ctx.cluster.memory[ctx.task], ctx.token)
    log.info("memory shard %d listening on %s", ctx.task, ctx.cluster.memory[ctx.task])
    scrapes = prometheus.serve(ctx, "memory", lambda: memory.Status(None, None))
    last_snapshot = time.monotonic()
    try:
        while not (stop.is_set() or memory.stopping.is_set()):
            stop.wait(0.2)
            due = time.monotonic() - last_snapshot >= ctx.cfg.run.checkpoint_interval_s
            if snapshots and due:
                try:
                    memory.snapshot(path)
                except OSError as err:  # a full disk must not take the replay down with it
                    log.error("snapshot failed: %s", err)
                last_snapshot = time.monotonic()
    finally:
        memory.close()
        if snapshots:  # on Shutdown and SIGTERM: what the table holds now
            log.info("snapshot of %d items written", memory.snapshot(path))
        if memory.log is not None:
            memory.log.close()
        if scrapes is not None:
            scrapes.shutdown()
        if calls is not None:
            calls.close()
        server.stop(grace=1.0).wait()
    return 0
