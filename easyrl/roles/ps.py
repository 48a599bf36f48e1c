"""Parameter-server shard: holds a partition of the variables and their optimizer state.

Applies pushed gradients asynchronously, serves the newest values, counts staleness and
drops what it must not apply. Shard 0 is also the run's metrics hub (see `easyrl.metrics`).

Pushes: a gRPC handler checks a push (shapes and dtypes, version, staleness, finiteness),
counts it and either drops it or accepts it into a bounded queue (`PushQueue`); the shard's
apply thread applies accepted pushes one at a time, in arrival order. A push asking to be
`queue`d is answered once accepted, before it is applied; the others once applied. Since every
accepted push is applied, the staleness a push will be applied with is known when it is
accepted: max_staleness is checked, and the staleness answered, then.

Synchronous rounds (PPO, ES): the learner publishes round r+1 on every shard
(`PublishRound`) once round r's gradients are applied; actors long-poll
with `Pull(min_round=r+1)`, which waits on a condition instead of spinning.
"""

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf

from easyrl.algorithms.optimizers import SLOTS, OptimizerGroups, OptimizerSpec, as_groups
from easyrl.atomic import save_npz
from easyrl.errors import EasyRLError
from easyrl.metrics import (
    MetricsWriter,
    RunStats,
    Stop,
    check_policies,
    check_stats,
    progress_line,
    stop_reason,
)
from easyrl.roles.push_queue import QUEUE_WAIT_S, PushQueue, QueuedPush
from easyrl.transport import codec, local, shm
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import easyrl_pb2_grpc as pb_grpc
from easyrl.transport.rpc import caller_active, invalid_argument_on_error, within_deadline

log = logging.getLogger(__name__)

REPORTERS = ("actor", "learner", "evaluator")
"""The roles that report to PS shard 0."""
Row = tuple[float, dict[str, float]]
"""One metrics row: (run clock, counters snapshot)."""


class ParameterServer(pb_grpc.ParameterServerServicer):
    """One PS shard.

    Args:
        shard: this shard's index.
        optimizer: how pushed gradients are applied: one spec, or {variable-name prefix:
            spec} for groups with their own optimizers (actor, critic, ...).
        max_staleness: gradients computed more than this many versions ago are dropped.
        checkpoint_path: `.npz` file to restore from on start and save to (None: never).
        stats: the run's counters (shard 0 only; None on other shards).
        round_rows: shard 0 of a `run.deterministic` run: each published round queues its
            metrics row on `round_rows` (see `publish`).
        pushes: accepted pushes waiting for the apply thread (None: a `PushQueue()`).

    The apply thread starts with the shard; `close` ends it.
    """

    def __init__(
        self,
        shard: int,
        optimizer: OptimizerSpec | dict[str, OptimizerSpec],
        max_staleness: int,
        checkpoint_path: Path | None = None,
        stats: RunStats | None = None,
        round_rows: bool = False,
        pushes: PushQueue | None = None,
    ):
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.shard = shard
        self.stats = stats
        self._spec = optimizer
        self._max_staleness = max_staleness
        self._checkpoint_path = checkpoint_path
        # _lock guards the values, optimizer, version, round, pull cache and the counters the
        # apply thread and Pull move (applied, staleness_sum, pulls); the queue's lock guards
        # the queue and the counters handlers move when they accept or drop a push.
        self._lock = threading.Lock()
        self._round_published = threading.Condition(self._lock)
        self._applied = threading.Condition(self._lock)
        self._queue = pushes if pushes is not None else PushQueue()
        self._optimizer: OptimizerGroups | None = None
        """The variables, in flat groups, and their optimizers (None until the first Assign)."""
        self._meta: dict[str, tuple] = {}
        self.version = 0
        self.round = 0
        names = "pushes applied dropped_stale dropped_nonfinite dropped_ahead pulls staleness_sum"
        names += " shm_requests shm_replies shm_refused"
        self.counters = dict.fromkeys(names.split(), 0)
        self.shared: shm.Attached | None = None
        """Set by the role when it serves: writes Pull replies' values into the segments of
        callers on this host (`easyrl.transport.shm`)."""
        self._pull_cache: tuple[int, list[pb.Tensor], codec.Body] = (-1, [], codec.Body())
        self._pull_reply: tuple[tuple[int, int], codec.Framed | None] = ((-1, -1), None)
        self.stopping = threading.Event()
        self.stop: Stop | None = None
        """Why the run stops (shard 0, once a stop condition is met)."""
        self.shutdown_requested = threading.Event()
        self._clock = time.monotonic()  # when the run started, as if it had never stopped
        self._clock_stopped: float | None = None  # when the run began to stop
        self.round_rows: queue.Queue[Row] | None = None
        """(run clock, snapshot) of each published round (a deterministic run's shard 0)."""
        if round_rows and stats is not None:
            self.round_rows = queue.Queue()
        if checkpoint_path is not None and checkpoint_path.exists():
            self._restore(checkpoint_path)
        self._queue.reset(self.version)
        self._applier = threading.Thread(
            target=self._apply_loop, name=f"ps-{shard}-apply", daemon=True
        )
        self._applier.start()

    # --- state -----------------------------------------------------------------------

    def _create(self, values: dict[str, np.ndarray], opt_state: dict | None = None) -> None:
        # Shapes and dtypes as plain Python values, checked on every push.
        self._meta = {n: (values[n].shape, values[n].dtype) for n in sorted(values)}
        self._optimizer = OptimizerGroups(self._spec, {n: values[n] for n in self._meta})
        if opt_state is not None:
            self._optimizer.load_state(opt_state)

    def _check_tensors(self, tensors: dict[str, np.ndarray], what: str, subset=False) -> None:
        """Raises ValueError unless `tensors` match this shard's variables exactly (or, with
        `subset`, some of them, in shape and dtype)."""
        names, mine = set(tensors), set(self._meta)
        if (not names <= mine) if subset else names != mine:
            raise ValueError(
                f"{what}: variables {sorted(tensors)} do not match this shard's "
                f"{sorted(self._meta)}"
            )
        for name, value in tensors.items():
            shape, dtype = self._meta[name]
            if value.shape != shape or value.dtype != dtype:
                raise ValueError(
                    f"{what}: {name} has shape {value.shape} {value.dtype}, expected "
                    f"{shape} {dtype}"
                )

    def checkpoint(self) -> None:
        """Saves variables, optimizer slots, version and counters (write, then rename)."""
        if self._checkpoint_path is None:
            return
        with self._queue.held(), self._lock:  # every accepted push applied, none accepted
            if self._optimizer is None:  # no values yet
                return
            arrays = {f"var/{n}": v for n, v in self._optimizer.values().items()}
            arrays.update({f"opt/{k}": v for k, v in self._optimizer.state().items()})
            meta = {
                "version": self.version,
                "round": self.round,
                "counters": dict(self.counters),  # as of this moment: pushes go on
                "elapsed_s": self.elapsed(),
            }
            if self.stats is not None:
                meta["stats"] = self.stats.state()
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        save_npz(self._checkpoint_path, arrays)

    def _restore(self, path: Path) -> None:
        with np.load(path) as data:
            meta = json.loads(data["meta"].tobytes())
            values = {k[4:]: data[k] for k in data.files if k.startswith("var/")}
            opt_state = {k[4:]: data[k] for k in data.files if k.startswith("opt/")}
        self._create(values, opt_state)
        self.version = int(meta["version"])
        self.round = int(meta.get("round", 0))
        self.counters.update(meta["counters"])
        elapsed = float(meta.get("elapsed_s", 0.0))
        self._clock -= elapsed  # the clock goes on from exactly what was checkpointed
        if self.stats is not None and "stats" in meta:
            self.stats.load_state(meta["stats"])
        log.info(
            "PS shard %d restored version %d and run clock %.2f s from %s",
            self.shard,
            self.version,
            elapsed,
            path,
        )

    def elapsed(self) -> float:
        """Seconds the run has trained: since this shard started plus what its checkpoint
        had counted (a restarted shard 0 keeps `stop.max_seconds` and metric times going;
        the time between the last checkpoint and the restart is not counted), up to when
        the run began to stop (`stop_clock`)."""
        end = time.monotonic() if self._clock_stopped is None else self._clock_stopped
        return end - self._clock

    def stop_clock(self) -> None:
        """Stops the run clock: the run is stopping, and winding down is not training (a run
        stopped by `stop.max_seconds` and resumed goes on from exactly that budget)."""
        if self._clock_stopped is None:
            self._clock_stopped = time.monotonic()

    # --- RPCs ------------------------------------------------------------------------

    @invalid_argument_on_error
    def Assign(self, request, context):
        values = codec.decode_named(request.tensors, request.body)
        if not values:
            raise ValueError("Assign: expected a non-empty list of tensors")
        for name, value in values.items():
            # float32 only: the shard's optimizer cannot update float16/float64 variables.
            if value.dtype != np.float32 or not np.all(np.isfinite(value)):
                raise ValueError(f"Assign: {name} must be finite float32, got {value.dtype}")
        state = codec.decode_named(request.optimizer_state, request.body)
        if request.updates < 0:
            raise ValueError(f"Assign: updates must be >= 0, got {request.updates}")
        with self._queue.held(), self._lock:  # after the pushes accepted before it
            if self._optimizer is not None and request.only_if_empty:
                return pb.AssignResponse(assigned=False, version=self.version)
            if self._optimizer is not None:
                self._check_tensors(values, "Assign")
                if state:
                    self._optimizer.load_state(state)  # checked whole first
                self._optimizer.assign(values)
            else:
                self._create(values, state or None)
            self.version += 1
            self.counters["applied"] += request.updates
            self._queue.reset(self.version)
            return pb.AssignResponse(assigned=True, version=self.version)

    @invalid_argument_on_error
    def Pull(self, request, context):
        if request.min_round < 0 or not 0 <= request.wait_s <= 600:
            raise ValueError("Pull: min_round must be >= 0 and wait_s in [0, 600]")
        # The wait ends at the caller's deadline, or as soon as it cancels.
        deadline = time.monotonic() + within_deadline(context, request.wait_s)
        active = caller_active(context)
        with self._lock:
            while request.min_round > self.round and not self.stopping.is_set() and active():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._round_published.wait(min(left, 0.1))
            self.counters["pulls"] += 1
            if request.optimizer_state and self._optimizer is not None:
                reply = self._with_state(pb.PullResponse(version=self.version, round=self.round))
            elif self.version == 0 or request.known_version == self.version:
                return pb.PullResponse(
                    version=self.version, current=self.version > 0, round=self.round
                )
            else:
                key = (self.version, self.round)
                if self._pull_reply[0] != key:  # one reply per version, serialized once
                    self._pull_reply = (
                        key,
                        self._with_values(pb.PullResponse(version=self.version, round=self.round)),
                    )
                reply = self._pull_reply[1]
            return shm.shared_reply(self.shared, request.shm_name, reply, self.counters)

    def _with_values(self, response):
        """`response` with the current values (read and laid out once per version; the
        caller holds the lock)."""
        if self._pull_cache[0] != self.version:
            assert self._optimizer is not None  # version > 0: assigned
            body = codec.Body()
            self._pull_cache = (self.version, body.named(self._optimizer.values()), body)
        _, tensors, body = self._pull_cache
        response.tensors.extend(tensors)
        return body.frame(response)

    def _with_state(self, response):
        """`response` with the current values and optimizer state (a learner that applies
        its own updates, starting; the caller holds the lock)."""
        assert self._optimizer is not None
        body = codec.Body()
        response.tensors.extend(body.named(self._optimizer.values()))
        response.optimizer_state.extend(body.named(self._optimizer.state()))
        return body.frame(response)

    @invalid_argument_on_error
    def Push(self, request, context):
        # A lent body is read in place and let go once applied (by the apply thread) or
        # dropped (here); any other is the request's bytes or a copy of them.
        lease = shm.lent_body(self.shared, request, self.counters) if request.shm_lent else None
        try:
            body = (
                lease.body
                if lease is not None
                else shm.request_body(self.shared, request, self.counters)
            )
            flat_grads = self._checked_push(
                request.version, codec.decode_named(request.gradients, body)
            )
            finite = all(all_finite(g) for g in flat_grads.values())
            size = sum(g.nbytes for g in flat_grads.values())
            with self._queue.changed:
                if not self._queue.wait_for_room(size, within_deadline(context, QUEUE_WAIT_S)):
                    why = "is stopping" if self._queue.closed else "applies pushes too slowly"
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"PS shard {self.shard} {why}")
                ticket, response = self._accept(request.version, flat_grads, finite, lease)
            if ticket:
                lease = None  # the apply thread's now
        finally:
            if lease is not None:
                lease.release()
        if ticket:
            if request.queue:
                response.queued = True
            else:
                self._wait_applied(ticket, context)
                response.applied = True
        # Values when asked for, unless the pusher computed against the newest already.
        if not ticket or not request.return_values or self.version == request.version:
            response.version = self.version
            return response
        with self._lock:
            response.version = self.version
            return self._with_values(response)

    def _checked_push(self, version: int, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A push's gradients as flat vectors by optimizer group.

        Raises:
            ValueError: the shard holds no values yet, or the push is malformed (no
                gradients, names, shapes or dtypes not this shard's, part of a group only,
                version < 1).
        """
        if self._optimizer is None:  # set once, by the first Assign
            raise ValueError("Push: shard is not initialized (no Assign yet)")
        if not grads:
            raise ValueError("Push: expected gradients")
        # Whole optimizer groups only (e.g. TD3's critic without its actor).
        self._check_tensors(grads, "Push", subset=True)
        flat_grads = self._optimizer.flatten(grads)
        if version < 1:
            raise ValueError(f"Push: version {version} must be >= 1")
        return flat_grads

    def _accept(
        self,
        version: int,
        flat_grads: dict[str, np.ndarray],
        finite: bool,
        lease: shm.Lease | None = None,
    ) -> tuple[int, pb.PushResponse]:
        """Counts a checked push and queues it (with the `lease` of its body, if lent), or
        drops it (counted, with the reason); the caller holds the queue's lock and made room.

        Returns:
            (the version the shard holds once the push is applied, or 0 when dropped; the
            reply so far).
        """
        self.counters["pushes"] += 1
        accepted = self._queue.accepted
        if version > accepted:
            # Computed against values this shard no longer has: it was restarted from an
            # older checkpoint. The pusher pulls the restored values and goes on.
            self.counters["dropped_ahead"] += 1
            return 0, pb.PushResponse(reason="ahead")
        staleness = accepted - version
        if staleness > self._max_staleness:
            self.counters["dropped_stale"] += 1
            return 0, pb.PushResponse(staleness=staleness, reason="stale")
        if not finite:
            self.counters["dropped_nonfinite"] += 1
            return 0, pb.PushResponse(staleness=staleness, reason="non-finite")
        ticket = self._queue.put(QueuedPush(flat_grads, staleness, lease))
        return ticket, pb.PushResponse(staleness=staleness)

    def _wait_applied(self, version: int, context) -> None:
        """Waits until the shard holds `version` (the push that brings it is applied).

        Raises:
            grpc.RpcError: UNAVAILABLE, the apply thread ended first (the shard stops).
        """
        with self._lock:
            while self.version < version and not self._queue.stopped:
                self._applied.wait(0.5)
            if self.version < version:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"PS shard {self.shard} stopped")

    def _apply_loop(self) -> None:
        """The apply thread: applies the accepted pushes one at a time, in arrival order,
        until the shard closes (after applying what is queued)."""
        try:
            while (push := self._queue.oldest()) is not None:
                with self._lock:
                    assert self._optimizer is not None  # pushes are accepted after Assign
                    try:
                        self._optimizer.apply_flat(push.grads)
                    finally:
                        if push.lease is not None:  # its caller may write into it again
                            push.lease.release()
                    self.version += 1
                    self.counters["applied"] += 1
                    self.counters["staleness_sum"] += push.staleness
                    self._applied.notify_all()
                self._queue.done()
        finally:
            self._queue.close(stopped=True)
            with self._lock:
                self._applied.notify_all()

    def applying(self) -> bool:
        """Whether the apply thread runs (it ends on `close`, or when applying failed)."""
        return self._applier.is_alive()

    def close(self, timeout_s: float = 10.0) -> None:
        """Accepts no more pushes, applies the accepted ones and ends the apply thread
        (waiting up to `timeout_s`)."""
        self._queue.close()
        self._applier.join(timeout_s)

    def publish(self, round_: int) -> None:
        """Publishes the current values as round `round_` (rounds only move forward) and
        wakes the actors waiting for it. With `round_rows`, it queues the round's metrics
        row before they wake: the learner has reported the round and the actor waits for
        the next, so what the counters hold then is fixed by the rounds, not by timing."""
        with self._lock:
            if round_ > self.round:
                self.round = round_
                if self.round_rows is not None and self.stats is not None:
                    snapshot = {**self.stats.snapshot(update_rates=True), **self._own_counters()}
                    self.round_rows.put((self.elapsed(), snapshot))
                self._round_published.notify_all()

    @invalid_argument_on_error
    def PublishRound(self, request, context):
        if request.round < 1:
            raise ValueError(f"PublishRound: round must be >= 1, got {request.round}")
        self.publish(request.round)
        return pb.PublishRoundResponse(stopping=self.stopping.is_set())

    @invalid_argument_on_error
    def Report(self, request, context):
        if self.stats is None:
            raise ValueError(f"Report goes to PS shard 0, not shard {self.shard}")
        if request.role not in REPORTERS or request.task < 0:
            raise ValueError(
                f"Report: role must be one of {', '.join(REPORTERS)} with a task >= 0, got "
                f"{request.role!r} task {request.task}"
            )
        if request.env_steps < 0 or request.updates < 0:
            raise ValueError("Report: counts must be >= 0")
        if any(length < 0 for length in request.episode_lengths):
            raise ValueError("Report: episode lengths must be >= 0")
        if len(request.episode_lengths) not in (0, len(request.episode_returns)):
            raise ValueError("Report: episode_lengths must match episode_returns")
        returns = [*request.episode_returns, *request.eval_returns]
        if not np.all(np.isfinite(np.asarray(returns, dtype=np.float64))):
            raise ValueError("Report: episode returns must be finite")
        check_stats(request.task, dict(request.stats))
        check_policies(list(request.episode_policies), len(request.episode_returns))
        self.stats.report(
            request.role,
            request.task,
            request.env_steps,
            request.updates,
            list(request.episode_returns),
            list(request.episode_lengths),
            dict(request.stats),
            list(request.eval_returns),
            list(request.episode_policies),
        )
        return pb.ReportResponse(stopping=self.stopping.is_set())

    def own_counters(self) -> dict[str, float]:
        """This shard's counters, version and round, named `ps/<shard>/...`."""
        with self._lock:
            return self._own_counters()

    def _own_counters(self) -> dict[str, float]:
        """`own_counters`, for a caller that holds the lock."""
        counters = {f"ps/{self.shard}/{k}": float(v) for k, v in self.counters.items()}
        counters[f"ps/{self.shard}/version"] = float(self.version)
        counters[f"ps/{self.shard}/round"] = float(self.round)
        counters[f"ps/{self.shard}/queued"] = float(len(self._queue))
        return counters

    def Status(self, request, context):
        counters = self.own_counters()
        with self._lock:
            initialized = self._optimizer is not None
        returns = []
        if self.stats is not None:
            counters.update(self.stats.snapshot())
            returns = self.stats.recent_returns()
        return pb.StatusResponse(
            role="ps",
            task=self.shard,
            version=self.version,
            initialized=initialized,
            stopping=self.stopping.is_set(),
            stop_reason=self.stop.text if self.stop else "",
            stop_kind=f"STOP_{self.stop.kind.name}" if self.stop else "STOP_NONE",
            counters=counters,
            recent_returns=returns,
            elapsed_s=self.elapsed() if self.stats is not None else 0.0,
        )

    def Shutdown(self, request, context):
        with self._lock:
            self.stop_clock()
            self.stopping.set()
            self.shutdown_requested.set()
            self._round_published.notify_all()  # long-polling Pulls answer at once
        return pb.ShutdownResponse()


def all_finite(x: np.ndarray) -> bool:
    """Whether every element of the flat float32 vector `x` is finite. On aligned memory x.x
    (one BLAS pass, no temporary) is finite only if every element is: infinities and NaNs
    carry through a sum of squares; the element-wise check runs when it is not (an overflow
    may be why) and on unaligned views of received bytes, where BLAS is slower than it."""
    if x.flags.aligned:
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.dot(x, x)):
                return True
    return bool(np.all(np.isfinite(x)))


def metrics_rows(
    ps: ParameterServer, stats: RunStats, interval_s: float, done: threading.Event
) -> Iterator[Row]:
    """(run clock, snapshot) of each metrics row until `done`: one every `interval_s`, or
    in a deterministic run (`ps.round_rows`) one per published round."""
    rows = ps.round_rows
    if rows is None:
        while not done.wait(interval_s):
            yield ps.elapsed(), {**stats.snapshot(update_rates=True), **ps.own_counters()}
        return
    while not done.is_set():
        try:
            yield rows.get(timeout=0.1)
        except queue.Empty:
            continue


def metrics_loop(ps: ParameterServer, stats: RunStats, cfg, run_dir: Path, done: threading.Event):
    """Shard 0 (`stats`: the run's counters): writes metrics rows (see `metrics_rows`) and
    raises the stop flag."""
    writer = MetricsWriter(run_dir)
    for elapsed, snapshot in metrics_rows(ps, stats, cfg.run.log_interval_s, done):
        if ps.round_rows is not None and ps.stopping.is_set():
            continue  # a deterministic run's rows end with the row that stopped it
        reason = None
        if not ps.stopping.is_set():
            reason = stop_reason(cfg.stop, snapshot, elapsed, cfg.output)
        if reason:
            log.info("stop condition: %s", reason.text)
            ps.stop_clock()
            ps.stop = reason
            ps.stopping.set()
        log.info("%s", progress_line(elapsed, snapshot))  # `kubectl logs`, bare-metal logs
        try:
            writer.write(snapshot, elapsed, reason.text if reason else None)
        except OSError as err:
            log.error("cannot write metrics: %s", err)


def weight_bytes(ctx) -> int:
    """Bytes of the largest Assign, Push or Pull reply of one shard: every variable the run's
    learners assign and push (from the actors' build of the algorithm), and the optimizer's
    slots of each when a lone learner applies its own updates (`learner.applies_locally`: it
    publishes and loads them; Adam's are twice the values)."""
    from easyrl.roles.learner import applies_locally

    if ctx.cfg.security.max_message_mb is not None:
        return 0  # the limit is set: no need to build the networks
    with tf.device("/CPU:0"):
        algo = ctx.build_algorithm()
    slots = 0
    if applies_locally(ctx, algo):
        slots = max(SLOTS[spec.kind] for spec in as_groups(ctx.optimizer()).values())
    return (1 + slots) * sum(v.shape.num_elements() * v.dtype.size for v in algo.variables.values())


def run(ctx) -> int:
    """Runs PS shard `ctx.task` until Shutdown or SIGTERM; checkpoints periodically and
    on exit. Returns the process exit code (1 when applying pushes failed)."""
    from easyrl.metrics import prometheus
    from easyrl.roles.common import stop_event_on_signals
    from easyrl.transport.rpc import add_servicer, make_server

    cfg = ctx.cfg
    stop = stop_event_on_signals()
    params = cfg.algorithm.params
    stats = RunStats(cfg.stop.window) if ctx.task == 0 else None
    optimizer = ctx.optimizer()
    checkpoint = ctx.run_dir / "checkpoints" / f"ps-{ctx.task}.npz"
    ps = ParameterServer(
        ctx.task, optimizer, params.max_staleness, checkpoint, stats, cfg.run.deterministic
    )
    # Every actor may hold a handler thread in a long-polling Pull (synchronous rounds).
    workers = 16 + ctx.cluster.actor
    limit = ctx.message_limit(weight_bytes(ctx))
    server, _ = make_server(
        ctx.cluster.ps[ctx.task],
        ctx.token,
        max_workers=workers,
        tls=ctx.tls(),
        max_message_bytes=limit,
    )
    if cfg.cluster.shared_memory:
        ps.shared = shm.Attached(shm.run_prefix(ctx.token))
    add_servicer("ps", ps, server)
    server.start()
    calls = local.serve("ps", ps, ctx.cluster.ps[ctx.task], ctx.token)
    log.info("PS shard %d listening on %s", ctx.task, ctx.cluster.ps[ctx.task])
    scrapes = prometheus.serve(ctx, "ps", lambda: ps.Status(None, None))
    done = threading.Event()
    threads = []
    if stats is not None:
        args = (ps, stats, cfg, ctx.run_dir, done)
        threads.append(threading.Thread(target=metrics_loop, args=args, daemon=True))
    for thread in threads:
        thread.start()
    last_checkpoint = time.monotonic()
    try:
        while not (stop.is_set() or ps.shutdown_requested.is_set()) and ps.applying():
            stop.wait(0.2)
            if time.monotonic() - last_checkpoint >= cfg.run.checkpoint_interval_s:
                ps.checkpoint()
                last_checkpoint = time.monotonic()
    finally:
        failed = not ps.applying()
        done.set()
        for thread in threads:
            thread.join(timeout=5)
        ps.close()  # what was acknowledged is applied before the final checkpoint
        try:
            ps.checkpoint()
        except (OSError, EasyRLError) as err:
            log.error("final checkpoint failed: %s", err)
        if scrapes is not None:
            scrapes.shutdown()
        if calls is not None:
            calls.close()
        server.stop(grace=1.0).wait()
    if failed:
        log.error("PS shard %d: the apply thread failed; exiting", ctx.task)
    return 1 if failed else 0
