"""Learner: samples from the memory shards, computes gradients, pushes them to the PS.

The loop is the flow's (`easyrl.flows`: `learn` of async_replay or sync_rounds); this module
is its plumbing: prefetch threads (Sample -> batch queue), push threads (gradients -> every
PS shard in parallel), a priority thread (new priorities -> the shard that issued the keys),
taking and publishing synchronous rounds, and reports to PS shard 0.
"""

import functools
import logging
import queue
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import grpc
import numpy as np
import tensorflow as tf

from easyrl.algorithms.contract import Agent, FusingLearner, concat
from easyrl.algorithms.optimizers import LocalOptimizer
from easyrl.errors import TransportError
from easyrl.flows import Prefetched, async_replay, sync_rounds
from easyrl.replay.sampled import NotReady, split_sample
from easyrl.roles.common import (
    RoleContext,
    ShardedWeights,
    StopSignal,
    put_until_stopped,
    stop_event_on_signals,
)
from easyrl.roles.publisher import Publisher

log = logging.getLogger(__name__)


def log_columns(batch: dict) -> None:
    """Logs the dtype and shape of every column of a batch (once, at the first batch: what
    the actors' data looks like when it reaches the learner)."""
    columns = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in sorted(batch.items()))
    log.info("first batch: %s", columns)


def pick_device(preference: str) -> str:
    """The TF device the learner computes on: the first GPU when one is visible
    (and allowed), else the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if preference == "gpu" and not gpus:
        log.warning("learner.device is 'gpu' but no GPU is visible; using the CPU")
    if preference != "cpu" and gpus:
        return "/GPU:0"
    return "/CPU:0"


class Learner:
    """The learner's loops (see the module docstring).

    Args:
        ctx: the role context.
        algo: the built agent; its `flow` picks the loop, which uses it as that flow's
            protocol (`easyrl.algorithms.contract`).
        stop: set to stop every loop.
    """

    def __init__(self, ctx: RoleContext, algo: Agent, stop: StopSignal):
        cfg = ctx.cfg
        self.ctx = ctx
        self.algo = algo
        self.stop = stop
        self.weights = ShardedWeights(ctx.clients("ps"), algo.variables)
        self.memories = ctx.clients("memory")
        self.batches: queue.Queue[Prefetched] = queue.Queue(maxsize=cfg.learner.batch_queue)
        self.pushes: queue.Queue = queue.Queue(maxsize=cfg.learner.push_queue)
        self.priorities: queue.Queue = queue.Queue(maxsize=64)
        self.pool = ThreadPoolExecutor(
            max_workers=len(self.weights.clients) * cfg.learner.push_threads
        )
        self.publisher: Publisher | None = None
        """Set when this learner applies its own updates (`applies_locally`)."""
        if applies_locally(ctx, algo):
            self.publisher = Publisher(self.weights, ctx.optimizer(), cfg.learner.publish_every)
        self.updates = 0
        self._reported = 0
        self._last_report = time.monotonic()
        self.counters = {
            "dropped_stale": 0,
            "dropped_nonfinite": 0,
            "abandoned_rounds": 0,
            "dropped_priority_updates": 0,
        }

    def prefetch(self, shard: int) -> None:
        """A prefetch thread: Sample from memory shard `shard` -> the batch queue, one
        batch per update (`learner.batches_per_sample` of them per Sample)."""
        cfg = self.ctx.cfg
        client, batch_size = self.memories[shard], cfg.algorithm.params.batch_size
        k = cfg.learner.batches_per_sample
        while not self.stop.is_set():
            sampled = client.sample(batch_size * k, timeout_s=1.0)
            if sampled is None:
                continue
            for part in split_sample(sampled, k):
                if not put_until_stopped(self.batches, Prefetched(shard, part), self.stop):
                    return

    def update_threads(self) -> list:
        """The loops that carry updates away: the publisher (local apply), else
        `push_threads` push loops."""
        if self.publisher is not None:
            return [functools.partial(self.publisher.loop, self.stop)]
        return [self.push_loop] * self.ctx.cfg.learner.push_threads

    def fuse_update(self) -> bool:
        """When this learner applies its own updates, `fuse_update` with its optimizer."""
        optimizer = None if self.publisher is None else self.publisher.optimizer
        return fuse_update(self.ctx, self.algo, optimizer)

    def values_for_update(self) -> list[int]:
        """Before an update: swaps in the newest values the PS shards returned and gives
        the shard versions the update is computed against (nothing to do when this learner
        applies its own updates: its values are the newest)."""
        if self.publisher is None:
            self.weights.swap_in()
        return list(self.weights.local_versions)

    def apply(self, grads: Sequence, versions: list[int]) -> bool:
        """One update's gradients (in the order of the variables, computed against
        `versions`): applied here (`publisher`), or queued for the push threads; False when
        the learner stopped while the push queue was full."""
        if self.publisher is not None:
            self.publisher.apply(grads, self.updates + 1, self.counters)
            return True
        return put_until_stopped(self.pushes, (self.weights.by_name(grads), versions), self.stop)

    def push_loop(self) -> None:
        """A push thread: gradients -> every PS shard in parallel."""
        while not self.stop.is_set():
            try:
                grads, versions = self.pushes.get(timeout=0.1)
            except queue.Empty:
                continue
            self.weights.push(grads, versions, self.ctx.task, self.pool, self.counters)

    def priority_loop(self) -> None:
        """The priority thread: new priorities -> the memory shard that issued the keys,
        one call per shard for what queued up. An update that outlives its deadline (a
        shard whose table thread is busy, e.g. copying a large snapshot on starved cores)
        is counted (`dropped_priority_updates`) and not waited for: the shard applies it
        when it gets to it, or those items keep their old priorities; the learner goes on.
        Any other transport failure stops the learner (see `guarded`)."""
        while not self.stop.is_set():
            try:
                pending = [self.priorities.get(timeout=0.1)]
            except queue.Empty:
                continue
            while not self.priorities.empty():  # merge what queued up: one call per shard
                pending.append(self.priorities.get_nowait())
            for shard in sorted({item[0] for item in pending}):
                items = [item for item in pending if item[0] == shard]
                keys, priorities = (np.concatenate([i[k] for i in items]) for k in (1, 2))
                try:
                    self.memories[shard].update_priorities(keys, priorities)
                except TransportError as err:
                    if err.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                    self.counters["dropped_priority_updates"] += 1
                    log.warning("memory shard %d: priority update dropped: %s", shard, err)

    def report(self, stats: dict) -> None:
        """Reports the updates since the last report and `stats` to PS shard 0; stops
        the learner when the run is stopping."""
        stats = {**stats, **{k: float(v) for k, v in self.counters.items()}}
        ps0, updates = self.weights.clients[0], self.updates - self._reported
        stopping = ps0.report("learner", self.ctx.task, updates=updates, stats=stats)
        self._reported, self._last_report = self.updates, time.monotonic()
        if stopping:
            log.info("run is stopping")
            self.stop.set()

    def report_due(self) -> bool:
        """Whether `updates_per_report` updates or 2 s passed since the last report."""
        every = self.ctx.cfg.learner.updates_per_report
        return self.updates % every == 0 or time.monotonic() - self._last_report > 2.0

    def take_batch(self) -> Prefetched | None:
        """The next prefetched batch (and its shard), or None after 0.1 s without one. A
        learner starved of batches (the actors stopped, the rate limiter holds the samples
        back) still reports every half second, so it learns soon that the run is stopping."""
        try:
            taken = self.batches.get(timeout=0.1)
        except queue.Empty:
            if time.monotonic() - self._last_report > 0.5:
                self.report({})
            return None
        if not self.updates:
            log_columns(taken.sample.data)
        return taken

    def run(self) -> None:
        """Initializes (chief) or pulls the weights, then runs the flow's loop until stopped."""
        if not self.ctx.wait_for_peers([*self.weights.clients, *self.memories], self.stop):
            return
        if self.ctx.task == 0 and self.weights.initialize():
            log.info("chief learner initialized the PS shards")
        if not self.weights.wait_initialized(self.stop, self.ctx.cfg.run.peer_timeout_s):
            return
        if self.publisher is not None:
            self.publisher.load()
            log.info("learner applies its own updates, publishes every %d", self.publisher.every)
        try:
            LOOPS[self.algo.flow](self)
        finally:
            if self.publisher is not None and self.updates:
                self.publisher.flush()
            self.pool.shutdown(wait=False)

    def take_round(self, round_: int) -> tuple[dict | None, int]:
        """Takes round `round_` from every memory shard (waiting until each is complete).

        Returns:
            (the round's items from all shards, round_), or (None, newer round) when some
            shard already collects a newer round (this learner resumed behind it), or
            (None, -1) when a restarted shard lost part of the round.
        """
        parts: dict[int, dict] = {}
        while not self.stop.is_set() and len(parts) < len(self.memories):
            missing = [i for i in range(len(self.memories)) if i not in parts]
            replies = self.pool.map(lambda i: self.memories[i].take_round(round_, 1.0), missing)
            for shard, reply in zip(missing, replies, strict=True):
                if reply.round > round_:
                    return None, reply.round
                if isinstance(reply, NotReady):
                    if reply.incomplete:
                        return None, -1
                else:
                    parts[shard] = reply.data
            if time.monotonic() - self._last_report > 2.0:
                self.report({"round": float(round_)})
        if len(parts) < len(self.memories):
            return None, round_
        batch = concat([parts[i] for i in sorted(parts)])
        if not self.updates:
            log_columns(batch)
        return batch, round_

    def publish(self, round_: int) -> None:
        """Publishes the current values as round `round_` on every PS shard."""
        list(self.pool.map(lambda c: c.publish_round(round_), self.weights.clients))


def applies_locally(ctx: RoleContext, algo: Agent) -> bool:
    """Whether this learner applies its own updates (`easyrl.roles.publisher`): the run's
    only learner, in the replay flow, with `learner.publish_every` > 0."""
    cfg = ctx.cfg
    alone = cfg.cluster.learner == 1 and cfg.learner.publish_every > 0
    return alone and algo.flow == "async_replay"


def fuse_update(ctx: RoleContext, algo: Agent, optimizer: LocalOptimizer | None) -> bool:
    """Given the optimizer of a learner that applies its own updates, and an agent whose
    step can take them in (its spec's `fused_update`; not multi-agent), hands the agent the
    optimizer: each step then applies its gradients (the update the learner runs, what
    `benchmarks/bench_learner.py` times as its compute); returns whether the agent's step
    then steps the target networks too."""
    if optimizer is None or not ctx.algorithm_spec().fused_update or ctx.cfg.multiagent.enabled:
        return False
    return bool(cast(FusingLearner, algo).fuse_update(optimizer))


LOOPS = {"async_replay": async_replay.learn, "sync_rounds": sync_rounds.learn}
"""The learner's loop of each flow (actor_gradients has no learner)."""


def run(ctx) -> int:
    """Runs learner `ctx.task` until the run stops or SIGTERM."""
    stop = stop_event_on_signals()
    device = pick_device(ctx.cfg.learner.device)
    log.info("learner %d computes on %s", ctx.task, device)
    with tf.device(device):
        algo = ctx.build_algorithm(learner=True)
        Learner(ctx, algo, stop).run()
    return 1 if stop.error else 0
