"""Replay-memory shard: one table, owned by one thread, behind a gRPC service.

gRPC handler threads validate requests and hand them to the table thread through a
queue; the table thread is the only code that touches the table and the rate
limiter (no locks on the table). Operations the rate limiter does not allow yet
wait in a pending list until they are legal or their deadline passes. The table
thread also keeps a small queue of ready, already-encoded sample batches so a
learner's Sample call usually returns without waiting for the table.

An aggregate table (synchronous rounds) has no rate limiter and no prefetch: an
Insert carries its weight round, and a Sample for round r waits until the round is
complete, then takes all of it.

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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from easyrl.atomic import save_npz
from easyrl.errors import RateLimitTimeout, ReplayError
from easyrl.replay.aggregate import AggregateTable
from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.tables import DATA_PREFIX, PrioritizedTable, UniformTable, validate_batch
from easyrl.replay.trajectory import FifoLimiter, FifoTable
from easyrl.seeds import derive_seed
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import easyrl_pb2_grpc as pb_grpc
from easyrl.transport.rpc import invalid_argument_on_error, within_deadline

log = logging.getLogger(__name__)


@dataclass
class _Op:
    """One request for the table thread."""

    kind: str  # "insert" | "sample" | "update" | "take_round" | "snapshot"
    args: tuple
    deadline: float
    future: Future = field(default_factory=Future)


class BetaSchedule:
    """Importance-sampling exponent annealed linearly over sampled batches."""

    def __init__(self, start: float, final: float, steps: int):
        self.start, self.final, self.steps = start, final, steps

    def __call__(self, batches: int) -> float:
        if self.steps <= 0:
            return self.start
        frac = min(1.0, batches / self.steps)
        return self.start + frac * (self.final - self.start)


class MemoryServer(pb_grpc.ReplayMemoryServicer):
    """A replay shard.

    Args:
        table: a `UniformTable`, `PrioritizedTable`, `FifoTable` or `AggregateTable`.
        limiter: the shard's rate limiter (a `FifoLimiter` for a FIFO; None for an
            aggregate table).
        batch_size: the learners' batch size (prefetched batches have this size).
        prefetch: how many ready batches to keep.
        beta: importance-sampling exponent schedule.
        shard: this shard's index (for status).
    """

    def __init__(
        self,
        table,
        limiter: RateLimiter | None,
        batch_size: int,
        prefetch: int,
        beta: BetaSchedule,
        shard: int = 0,
    ):
        if batch_size < 1 or prefetch < 1:
            raise ValueError("batch_size and prefetch must be >= 1")
        self.table = table
        self.rounds = isinstance(table, AggregateTable)
        if (limiter is None) != self.rounds:
            raise ValueError("an aggregate table takes no rate limiter; other tables need one")
        self.limiter = limiter
        self.batch_size = batch_size
        self.shard = shard
        self._beta = beta
        self._ops: queue.Queue[_Op] = queue.Queue()
        self._ready: queue.Queue[pb.SampleResponse] = queue.Queue(maxsize=prefetch)
        self._pending: collections.deque[_Op] = collections.deque()
        self.counters = collections.Counter()
        self.stopping = threading.Event()
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
        while not self.stopping.is_set():
            self._take_ops(0.002 if self._pending else 0.05)
            self._run_pending()
            self._fill_prefetch()
        for op in self._pending:
            op.future.set_exception(ReplayError("memory shard is shutting down"))

    def _run_pending(self) -> None:
        still = collections.deque()
        now = time.monotonic()
        for op in self._pending:
            try:
                result = self._try(op)
            except ReplayError as err:
                op.future.set_exception(err)
                continue
            if result is not None:
                op.future.set_result(result)
            elif now >= op.deadline:
                self.counters[f"rate_limited_{op.kind}"] += 1
                op.future.set_exception(RateLimitTimeout(f"{op.kind} timed out (rate limiter)"))
            else:
                still.append(op)
        self._pending = still

    def _try(self, op: _Op):
        """Runs `op` if the rate limiter allows it now; returns its result or None."""
        if op.kind == "snapshot":  # a copy taken between two operations: consistent
            return self.table.state_dict()
        if self.rounds:
            return self._try_round(op)
        if op.kind == "insert":
            batch, priorities, n, active = op.args
            if not active():  # the caller's deadline passed while the op waited: not stored
                self.counters["inserts_abandoned"] += n
                raise ReplayError("the caller gave up before the insert ran")
            if not self.limiter.can_insert(n):
                return None
            self.table.insert(batch, priorities)
            self.limiter.on_insert(n)
            self.counters["inserts"] += n
            return pb.InsertResponse(size=self.table.size, inserted=self.table.inserted)
        if op.kind == "sample":
            (batch_size,) = op.args
            if not self.limiter.can_sample(batch_size):
                return None
            return self._sample(batch_size)
        keys, priorities = op.args
        updated = self.table.update_priorities(keys, priorities)
        self.counters["priority_updates"] += updated
        self.counters["stale_priority_keys"] += len(keys) - updated
        return pb.UpdatePrioritiesResponse(updated=updated)

    def _try_round(self, op: _Op):
        """Aggregate table: inserts always run; a round is taken once complete."""
        table = self.table
        if op.kind == "insert":
            batch, round_, n = op.args
            kept = table.insert(batch, round_)
            self.counters["inserts" if kept else "refused_stale"] += n
            return pb.InsertResponse(
                size=table.size, inserted=table.inserted, refused=not kept, round=table.round
            )
        round_, caller_active = op.args
        if not caller_active():  # the caller gave up (deadline, crash): keep the round
            raise ReplayError("the caller is gone")
        table.catch_up(round_)
        if table.round > round_:  # the caller is behind: tell it which round is collected
            return pb.SampleResponse(ready=False, round=table.round)
        if table.incomplete_round == round_:
            return pb.SampleResponse(ready=False, round=round_, incomplete=True)
        if not table.ready(round_):
            return None
        batch = table.take(round_)
        self.counters["rounds_released"] += 1
        self.counters["samples"] += len(next(iter(batch.values())))
        return pb.SampleResponse(ready=True, tensors=codec.encode_batch(batch), round=round_)

    def _sample(self, batch_size: int) -> pb.SampleResponse:
        sample = self.table.sample(batch_size, self._beta(self.counters["sample_batches"]))
        self.limiter.on_sample(batch_size)
        self.counters["samples"] += batch_size
        self.counters["sample_batches"] += 1
        return pb.SampleResponse(
            ready=True,
            tensors=codec.encode_batch(sample.data),
            keys=codec.encode_array("keys", sample.keys),
            weights=codec.encode_array("weights", sample.weights),
        )

    def _fill_prefetch(self) -> None:
        if self.rounds:  # an aggregate table releases whole rounds on request only
            return
        while not self._ready.full() and self.limiter.can_sample(self.batch_size):
            try:
                response = self._sample(self.batch_size)
            except ReplayError as err:  # e.g. every stored priority is zero: retry later
                log.debug("prefetch skipped: %s", err)
                return
            self._ready.put_nowait(response)

    def _submit(self, kind: str, args: tuple, timeout_s: float):
        if self.stopping.is_set():
            raise ReplayError("memory shard is shutting down")
        op = _Op(kind, args, time.monotonic() + timeout_s)
        self._ops.put(op)
        while True:
            try:
                return op.future.result(timeout=0.1)
            except TimeoutError:
                # The table thread is gone (shutdown): nobody will ever answer this op.
                if not self._thread.is_alive() and not op.future.done():
                    raise ReplayError("memory shard is shutting down") from None

    # --- RPCs ------------------------------------------------------------------------

    @invalid_argument_on_error
    def Insert(self, request, context):
        batch = codec.decode_batch(request.tensors)
        n = validate_batch(self.table.spec, batch)
        if isinstance(self.table, FifoTable) and n > self.table.capacity:  # would wait forever
            raise ReplayError(f"{n} unrolls never fit a trajectory table of {self.table.capacity}")
        priorities = None
        if request.HasField("priorities"):
            priorities = codec.decode_array(request.priorities).astype(np.float64)
            if priorities.shape != (n,) or not np.all(np.isfinite(priorities)):
                raise ReplayError(f"priorities must be {n} finite values")
            if np.any(priorities < 0):
                raise ReplayError("priorities must be >= 0")
        timeout = within_deadline(context, 5.0)
        if self.rounds:
            if priorities is not None or request.round < 0:
                raise ReplayError("an aggregate table takes a round >= 0 and no priorities")
            return self._submit("insert", (batch, request.round, n), timeout)
        active = context.is_active if context is not None else (lambda: True)
        try:
            return self._submit("insert", (batch, priorities, n, active), timeout)
        except RateLimitTimeout as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    @invalid_argument_on_error
    def Sample(self, request, context):
        if not 0 <= request.timeout_s <= 600:
            raise ReplayError("timeout_s must be in [0, 600]")
        if self.rounds:
            return self._take_round(request, context)
        if not 1 <= request.batch_size <= self.table.capacity:
            raise ReplayError(f"batch_size must be in [1, {self.table.capacity}]")
        if request.batch_size == self.batch_size:
            try:
                batch = self._ready.get(timeout=request.timeout_s)
            except queue.Empty:
                return pb.SampleResponse(ready=False)
            self._ops.put(None)  # wake the table thread to refill the prefetch queue
            return batch
        try:
            return self._submit("sample", (request.batch_size,), request.timeout_s)
        except RateLimitTimeout:
            return pb.SampleResponse(ready=False)

    def _take_round(self, request, context) -> pb.SampleResponse:
        if request.round < 0 or request.batch_size != 0:
            raise ReplayError("an aggregate table takes a round >= 0 and batch_size 0 (all of it)")
        # Give up before the caller's deadline does, and never release a round to a caller
        # that is gone: its items would be lost.
        timeout = within_deadline(context, request.timeout_s)
        active = context.is_active if context is not None else (lambda: True)
        try:
            return self._submit("take_round", (request.round, active), timeout)
        except RateLimitTimeout:
            return pb.SampleResponse(ready=False, round=self.table.round)

    @invalid_argument_on_error
    def UpdatePriorities(self, request, context):
        if self.rounds:
            raise ReplayError("an aggregate table has no priorities")
        keys = codec.decode_array(request.keys)
        priorities = codec.decode_array(request.priorities)
        if keys.ndim != 1 or keys.dtype.kind not in "iu" or priorities.shape != keys.shape:
            raise ReplayError("keys must be 1-D integers and priorities of the same shape")
        return self._submit("update", (keys.astype(np.int64), priorities), 0.0)

    def Status(self, request, context):
        snapshot = dict(self.counters)  # the table thread may add keys meanwhile
        counters = {f"memory/{self.shard}/{k}": float(v) for k, v in snapshot.items()}
        counters[f"memory/{self.shard}/size"] = float(self.table.size)
        if self.rounds:
            counters[f"memory/{self.shard}/round"] = float(self.table.round)
            counters[f"memory/{self.shard}/dropped_items"] = float(self.table.refused)
        counters[f"memory/{self.shard}/ready_batches"] = float(self._ready.qsize())
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
        """Stops the table thread."""
        self.stopping.set()
        self._thread.join(timeout=5)

    @property
    def snapshots(self) -> bool:
        """Whether this shard's table can be snapshotted (replay and trajectory tables; an
        aggregate round is not: a restarted shard makes the learner abandon the round)."""
        return hasattr(self.table, "state_dict")

    def snapshot(self, path: Path) -> int:
        """Writes the table to `path` (write, then rename): copied by the table thread between
        two operations (inserts pause only for the copy), written by the caller. After
        `close` the table is read directly.

        Returns:
            The number of items saved.
        """
        if self._thread.is_alive():
            state = self._submit("snapshot", (), 0.0)
        else:
            state = self.table.state_dict()
        save_npz(path, state)
        items = len(next(v for k, v in state.items() if k.startswith(DATA_PREFIX)))
        self.counters["snapshot_items"] = items
        return items


def restore(table, path: Path) -> int:
    """Loads a snapshot written by `MemoryServer.snapshot` into a new table.

    Returns:
        The number of items restored (0 when there is no snapshot).

    Raises:
        ReplayError: the snapshot does not fit the table (another config); nothing changed.
    """
    if not path.exists():
        return 0
    with np.load(path) as data:
        state = {k: data[k].item() if data[k].ndim == 0 else data[k] for k in data.files}
    table.load_state_dict(state)
    log.info("restored %d items from %s", table.size, path)
    return table.size


def round_size(cfg, module, num_actors: int, num_memory: int, shard: int) -> int:
    """Items that complete a round on memory `shard`: the shares of the actors that ship
    to it (actor i ships to shard i % num_memory)."""
    params, num_envs = cfg.algorithm.params, cfg.env.num_envs
    return sum(
        module.round_share(params, num_envs, i, num_actors)
        for i in range(shard, num_actors, num_memory)
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
    module = registry.module(cfg.algorithm.name)
    items = module.dataset_items(cfg.algorithm.params, read_steps(directory, indices))
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


def build(
    cfg, spec, shard: int, cluster=None, snapshot: Path | None = None, restarted: bool = False
) -> MemoryServer:
    """Builds a memory shard from the config's `replay` section and a table spec.

    Args:
        cfg: the run's config.
        spec: the table's column spec (from the algorithm's `replay_spec`).
        shard: this shard's index.
        cluster: the cluster spec (needed by an aggregate table to size its rounds).
        snapshot: a replay or trajectory table restores this snapshot when it exists.
        restarted: this shard ran before in this run directory (an aggregate table then
            marks its first round incomplete).
    """
    r = cfg.replay
    if cfg.input.dir is not None:  # offline: the dataset's items, sampling only
        num_memory = len(cluster.memory) if cluster is not None else 1
        table, shards = load_dataset(cfg, spec, shard, num_memory)
        limiter = RateLimiter(min(r.min_size_to_sample, table.size))
        limiter.on_insert(table.size)  # before the table thread starts reading it
        batch_size = cfg.algorithm.params.batch_size
        memory = MemoryServer(table, limiter, batch_size, r.prefetch, BetaSchedule(0, 0, 0), shard)
        memory.counters.update(loaded_items=table.size, loaded_shards=shards)
        return memory
    seed = derive_seed(cfg.run.seed, "memory", shard)
    if r.kind == "aggregate":
        from easyrl.algorithms import registry

        module = registry.module(cfg.algorithm.name)
        size = round_size(cfg, module, cluster.actor, len(cluster.memory), shard)
        table = AggregateTable(spec, r.capacity, size, restarted)
        return MemoryServer(table, None, 1, 1, BetaSchedule(0, 0, 0), shard)
    batch_size = cfg.algorithm.params.batch_size
    if r.kind == "trajectory":  # items are unrolls; one shipment is one unroll per env
        table = FifoTable(spec, r.capacity)
        limiter = FifoLimiter(table)
        limiter.check_batch_sizes(cfg.env.num_envs, batch_size)
        beta = BetaSchedule(0, 0, 0)
    else:
        if r.kind == "prioritized":
            table = PrioritizedTable(spec, r.capacity, alpha=r.alpha, seed=seed)
        else:
            table = UniformTable(spec, r.capacity, seed=seed)
        limiter = RateLimiter(r.min_size_to_sample, r.samples_per_insert, r.error_buffer)
        limiter.check_batch_sizes(cfg.actor.send_every * cfg.env.num_envs, batch_size)
        beta = BetaSchedule(r.beta, r.beta_final, r.beta_anneal_steps)
    restored = restore(table, snapshot) if snapshot is not None else 0
    memory = MemoryServer(table, limiter, batch_size, r.prefetch, beta, shard)
    memory.counters["restored_items"] = restored
    return memory


def run(ctx) -> int:
    """Runs memory shard `ctx.task` until Shutdown or SIGTERM."""
    from easyrl.roles.common import stop_event_on_signals
    from easyrl.transport.rpc import make_server

    stop = stop_event_on_signals()
    obs_space, action_space = ctx.spaces()
    spec = ctx.algorithm_module().replay_spec(ctx.cfg.algorithm.params, obs_space, action_space)
    path = ctx.run_dir / "checkpoints" / f"memory-{ctx.task}.npz"
    marker = path.with_suffix(".started")  # left by an earlier process of this shard
    restarted = marker.exists()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    memory = build(ctx.cfg, spec, ctx.task, ctx.cluster, snapshot=path, restarted=restarted)
    snapshots = memory.snapshots and ctx.cfg.input.dir is None  # a dataset is reloaded
    # Every actor keeps one Insert in flight, and one the rate limiter holds back occupies
    # a handler thread: enough threads that learners' Samples never queue behind them.
    workers = 16 + ctx.cluster.actor + 4 * ctx.cluster.learner
    server, _ = make_server(
        ctx.cluster.memory[ctx.task], ctx.token, max_workers=workers, tls=ctx.tls()
    )
    pb_grpc.add_ReplayMemoryServicer_to_server(memory, server)
    server.start()
    log.info("memory shard %d listening on %s", ctx.task, ctx.cluster.memory[ctx.task])
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
        server.stop(grace=1.0).wait()
    return 0
