"""Learner: samples from the memory shards, computes gradients, pushes them to the PS.

Threads: one prefetch thread per memory shard (Sample -> batch queue), the main
loop (one compiled gradient step per batch), a push thread (gradients to every PS
shard in parallel, then pull the new values) and a priority thread (new
priorities back to the shard that issued the keys). Bounded queues between them
make back-pressure explicit.
"""

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
        self.counters = {"dropped_stale": 0, "dropped_nonfinite": 0}

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

    def _push_one(self, shard: int, grads: dict, version: int) -> pb.PushResponse:
        names = self.weights.shard_names[shard]
        request = pb.PushRequest(
            version=version,
            gradients=codec.encode_named({n: grads[n] for n in names}),
            learner=self.ctx.task,
            return_values=True,
        )
        return self.weights.clients[shard].call("Push", request)

    def _push_loop(self) -> None:
        while not self.stop.is_set():
            try:
                grads, versions = self.pushes.get(timeout=0.1)
            except queue.Empty:
                continue
            replies = list(
                self._pool.map(
                    self._push_one, range(len(versions)), [grads] * len(versions), versions
                )
            )
            for shard, reply in enumerate(replies):
                if reply.applied:
                    self.weights.offer(shard, reply.version, reply.tensors)
                elif reply.reason == "stale":
                    self.counters["dropped_stale"] += 1
                elif reply.reason == "non-finite":
                    self.counters["dropped_nonfinite"] += 1
            if any(not reply.applied for reply in replies):
                self.weights.fetch()

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

    def run(self) -> None:
        """Initializes (chief) or pulls the weights, then trains until stopped."""
        cfg = self.ctx.cfg
        if self.ctx.task == 0 and self.weights.initialize():
            log.info("chief learner initialized the PS shards")
        if not self.weights.wait_initialized(self.stop):
            return
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
        ps0 = self.weights.clients[0]
        params = cfg.algorithm.params
        reported, stats = 0, {}
        last_report = time.monotonic()
        while not self.stop.is_set():
            try:
                shard, batch, keys, is_weights = self.batches.get(timeout=0.1)
            except queue.Empty:
                continue
            self.weights.swap_in()
            versions = list(self.weights.local_versions)
            grads, stats, priorities = self.algo.learn(batch, is_weights)
            named = dict(zip(self.algo.variables, grads, strict=True))
            if not put_until_stopped(self.pushes, (named, versions), self.stop):
                break
            if cfg.replay.kind == "prioritized":
                put_until_stopped(
                    self.priorities, (shard, keys, priorities.astype(np.float64)), self.stop
                )
            self.updates += 1
            if self.updates % params.target_update_period == 0:
                self.weights.swap_in()
                self.algo.sync_target()
            if self.updates % cfg.learner.updates_per_report == 0 or (
                time.monotonic() - last_report > 2.0
            ):
                stats = {**stats, **{k: float(v) for k, v in self.counters.items()}}
                reply = ps0.call(
                    "Report",
                    pb.ReportRequest(
                        role="learner",
                        task=self.ctx.task,
                        updates=self.updates - reported,
                        stats=stats,
                    ),
                )
                reported, last_report = self.updates, time.monotonic()
                if reply.stopping:
                    log.info("run is stopping")
                    self.stop.set()
        for thread in threads:
            thread.join(timeout=5)
        self._pool.shutdown(wait=False)


def run(ctx) -> int:
    """Runs learner `ctx.task` until the run stops or SIGTERM."""
    stop = stop_event_on_signals()
    device = pick_device(ctx.cfg.learner.device)
    log.info("learner %d computes on %s", ctx.task, device)
    with tf.device(device):
        algo = ctx.build_algorithm()
        Learner(ctx, algo, stop).run()
    return 1 if stop.error else 0
