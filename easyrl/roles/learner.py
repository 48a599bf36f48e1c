"""Learner: samples from the memory shards, computes gradients, pushes them to the PS.

Async replay (DQN) threads: one prefetch thread per memory shard (Sample -> batch
queue), the main loop (one compiled gradient step per batch), a push thread
(gradients to every PS shard in parallel, then pull the new values) and a priority
thread (new priorities back to the shard that issued the keys). Bounded queues
between them make back-pressure explicit.

Synchronous rounds (PPO, ES): take the whole of round r from every memory shard,
run the algorithm's round of updates (each update's gradients pushed to every PS
shard, the new values swapped in before the next), then publish round r + 1 on
every PS shard, which releases the actors.
"""

import collections
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

from easyrl.roles.common import (
    ShardedWeights,
    guarded,
    put_until_stopped,
    stop_event_on_signals,
)
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

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
        algo: the built algorithm (networks, `learn`, `sync_target`).
        stop: set to stop every loop.
    """

    def __init__(self, ctx, algo, stop: threading.Event):
        cfg = ctx.cfg
        self.ctx = ctx
        self.algo = algo
        self.stop = stop
        self.weights = ShardedWeights(ctx.clients("ps"), algo.variables)
        self.memories = ctx.clients("memory")
        self.batches: queue.Queue = queue.Queue(maxsize=cfg.learner.batch_queue)
        self.pushes: queue.Queue = queue.Queue(maxsize=cfg.learner.push_queue)
        self.priorities: queue.Queue = queue.Queue(maxsize=64)
        self._pool = ThreadPoolExecutor(
            max_workers=len(self.weights.clients) * cfg.learner.push_threads
        )
        self.updates = 0
        self._reported = 0
        self._last_report = time.monotonic()
        self.counters = {"dropped_stale": 0, "dropped_nonfinite": 0, "abandoned_rounds": 0}

    # --- threads ---------------------------------------------------------------------

    def _prefetch(self, shard: int) -> None:
        client = self.memories[shard]
        request = pb.SampleRequest(
            batch_size=self.ctx.cfg.algorithm.params.batch_size, timeout_s=1.0
        )
        while not self.stop.is_set():
            reply = client.call("Sample", request)
            if not reply.ready:
                continue
            item = (
                shard,
                codec.decode_batch(reply.tensors),
                codec.decode_array(reply.keys),
                codec.decode_array(reply.weights),
            )
            if not put_until_stopped(self.batches, item, self.stop):
                return

    def _push_loop(self) -> None:
        while not self.stop.is_set():
            try:
                grads, versions = self.pushes.get(timeout=0.1)
            except queue.Empty:
                continue
            self.weights.push(grads, versions, self.ctx.task, self._pool, self.counters)

    def _priority_loop(self) -> None:
        while not self.stop.is_set():
            try:
                pending = [self.priorities.get(timeout=0.1)]
            except queue.Empty:
                continue
            while not self.priorities.empty():  # merge what queued up: one call per shard
                pending.append(self.priorities.get_nowait())
            for shard in sorted({item[0] for item in pending}):
                items = [item for item in pending if item[0] == shard]
                request = pb.UpdatePrioritiesRequest(
                    keys=codec.encode_array("keys", np.concatenate([i[1] for i in items])),
                    priorities=codec.encode_array(
                        "priorities", np.concatenate([i[2] for i in items])
                    ),
                )
                self.memories[shard].call("UpdatePriorities", request)

    def _report(self, stats: dict) -> None:
        """Reports the updates since the last report and `stats` to PS shard 0; stops
        the learner when the run is stopping."""
        stats = {**stats, **{k: float(v) for k, v in self.counters.items()}}
        reply = self.weights.clients[0].call(
            "Report",
            pb.ReportRequest(
                role="learner",
                task=self.ctx.task,
                updates=self.updates - self._reported,
                stats=stats,
            ),
        )
        self._reported, self._last_report = self.updates, time.monotonic()
        if reply.stopping:
            log.info("run is stopping")
            self.stop.set()

    def run(self) -> None:
        """Initializes (chief) or pulls the weights, then trains until stopped."""
        if not self.ctx.wait_for_peers([*self.weights.clients, *self.memories], self.stop):
            return
        if self.ctx.task == 0 and self.weights.initialize():
            log.info("chief learner initialized the PS shards")
        if not self.weights.wait_initialized(self.stop, self.ctx.cfg.run.peer_timeout_s):
            return
        try:
            if self.algo.flow == "sync_rounds":
                self._rounds_loop()
            else:
                self._replay_loop()
        finally:
            self._pool.shutdown(wait=False)

    def _take_round(self, round_: int) -> tuple[dict | None, int]:
        """Takes round `round_` from every memory shard (waiting until each is complete).

        Returns:
            (the round's items from all shards, round_), or (None, newer round) when some
            shard already collects a newer round (this learner resumed behind it), or
            (None, -1) when a restarted shard lost part of the round.
        """
        request = pb.SampleRequest(round=round_, timeout_s=1.0)
        parts: dict[int, dict] = {}
        while not self.stop.is_set() and len(parts) < len(self.memories):
            missing = [i for i in range(len(self.memories)) if i not in parts]
            replies = self._pool.map(lambda i: self.memories[i].call("Sample", request), missing)
            for shard, reply in zip(missing, replies, strict=True):
                if reply.round > round_:
                    return None, reply.round
                if reply.incomplete:
                    return None, -1
                if reply.ready:
                    parts[shard] = codec.decode_batch(reply.tensors)
            if time.monotonic() - self._last_report > 2.0:
                self._report({"round": float(round_)})
        if len(parts) < len(self.memories):
            return None, round_
        batch = {k: np.concatenate([parts[i][k] for i in sorted(parts)]) for k in parts[0]}
        return batch, round_

    def _publish(self, round_: int) -> None:
        """Publishes the current values as round `round_` on every PS shard."""
        request = pb.ReportRequest(publish_round=round_)
        list(self._pool.map(lambda c: c.call("Report", request), self.weights.clients))

    def _rounds_loop(self) -> None:
        """Synchronous rounds: take round r, train on it, publish round r + 1."""
        rng = np.random.default_rng(self.ctx.cfg.run.seed * 7919 + self.ctx.task)
        round_ = self.weights.round
        while not self.stop.is_set():
            batch, found = self._take_round(round_)
            if batch is None:
                if found > round_:  # resumed behind the memories: skip to their round
                    log.info("memory collects round %d; publishing it", found)
                    round_ = found
                    self._publish(round_)
                elif found < 0:  # a memory shard restarted mid-round: collect it anew
                    log.warning("round %d lost items on a restarted memory shard", round_)
                    self.counters["abandoned_rounds"] += 1
                    round_ += 1
                    self._publish(round_)
                continue
            if not self.updates:
                log_columns(batch)
            totals, steps = collections.Counter(), 0
            for grads, stats in self.algo.learn_round(batch, rng):
                self.weights.push_and_swap_in(grads, self.ctx.task, self._pool, self.counters)
                self.updates += 1
                totals.update(stats)
                steps += 1
                if self.stop.is_set():
                    return
            changed = self.algo.end_round(batch)  # e.g. observation statistics
            if changed:
                self.weights.assign_local(changed)
            round_ += 1
            self._publish(round_)
            means = {k: v / max(steps, 1) for k, v in totals.items()}  # the round's mean stats
            self._report({**means, "round": float(round_), "updates_per_round": float(steps)})

    def _replay_loop(self) -> None:
        """Async replay: prefetch, compute, push and update priorities on separate threads."""
        cfg = self.ctx.cfg
        period = self.algo.target_update_period  # 0: no target network
        if period:
            self.algo.sync_target()
        threads = [
            threading.Thread(target=guarded, args=(self._prefetch, self.stop, i), daemon=True)
            for i in range(len(self.memories))
        ]
        threads += [
            threading.Thread(target=guarded, args=(self._push_loop, self.stop), daemon=True)
            for _ in range(cfg.learner.push_threads)
        ]
        threads.append(
            threading.Thread(target=guarded, args=(self._priority_loop, self.stop), daemon=True)
        )
        for thread in threads:
            thread.start()
        stats = {}
        while not self.stop.is_set():
            try:
                shard, batch, keys, is_weights = self.batches.get(timeout=0.1)
            except queue.Empty:
                continue
            if not self.updates:
                log_columns(batch)
            self.weights.swap_in()
            versions = list(self.weights.local_versions)
            grads, stats, priorities = self.algo.learn(batch, is_weights)
            named = self.weights.by_name(grads)
            if not put_until_stopped(self.pushes, (named, versions), self.stop):
                break
            if cfg.replay.kind == "prioritized":
                put_until_stopped(
                    self.priorities, (shard, keys, priorities.astype(np.float64)), self.stop
                )
            self.updates += 1
            if period and self.updates % period == 0:
                self.weights.swap_in()
                self.algo.sync_target()
            if self.updates % cfg.learner.updates_per_report == 0 or (
                time.monotonic() - self._last_report > 2.0
            ):
                self._report(stats)
        for thread in threads:
            thread.join(timeout=5)


def run(ctx) -> int:
    """Runs learner `ctx.task` until the run stops or SIGTERM."""
    stop = stop_event_on_signals()
    device = pick_device(ctx.cfg.learner.device)
    log.info("learner %d computes on %s", ctx.task, device)
    with tf.device(device):
        algo = ctx.build_algorithm(learner=True)
        Learner(ctx, algo, stop).run()
    return 1 if stop.error else 0
