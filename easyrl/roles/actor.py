"""Actor: steps a vector of environments with its local copy of the policy.

Threads: the main loop (inference + env step + post-processing), a sender thread
(bounded queue -> memory shard `actor_index % num_memory`) and a weight-sync
thread (PS shards -> a "latest weights" slot the main loop swaps in between
steps).
"""

import logging
import queue
import threading
import time

import grpc
import numpy as np

from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import TransportError
from easyrl.roles.common import (
    ShardedWeights,
    guarded,
    put_until_stopped,
    stop_event_on_signals,
)
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

log = logging.getLogger(__name__)

RETRY_INSERT = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)


class EpisodeTracker:
    """Accumulates per-env returns and lengths; hands out finished episodes."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []

    def step(self, rewards: np.ndarray, done: np.ndarray) -> None:
        """Adds one vector step's rewards; closes the episodes of envs that are done."""
        self.returns += rewards
        self.lengths += 1
        self.finished_returns.extend(self.returns[done].tolist())
        self.finished_lengths.extend(self.lengths[done].tolist())
        self.returns[done] = 0.0
        self.lengths[done] = 0

    def take(self) -> tuple[list[float], list[int]]:
        """Returns and clears the finished episodes."""
        out = (self.finished_returns, self.finished_lengths)
        self.finished_returns, self.finished_lengths = [], []
        return out


class Actor:
    """The actor's loops (see the module docstring)."""

    def __init__(self, ctx, algo, stop: threading.Event):
        self.ctx = ctx
        self.algo = algo
        self.stop = stop
        self.weights = ShardedWeights(ctx.clients("ps"), algo.variables)
        self.memory = ctx.client("memory", ctx.task % len(ctx.cluster.memory))
        self.outbox: queue.Queue = queue.Queue(maxsize=ctx.cfg.actor.queue_size)
        self.sync_requested = threading.Event()
        self.counters = {"sent": 0, "rate_limited": 0}

    def _sender(self) -> None:
        while not self.stop.is_set():
            try:
                request = self.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                try:
                    self.memory.call("Insert", request)
                    self.counters["sent"] += 1
                    break
                except TransportError as err:
                    # Rate limited: the shard refused (RESOURCE_EXHAUSTED) or the call ran out
                    # of time while waiting; send the same batch again (a rare duplicate
                    # transition in replay is harmless, a lost batch is not).
                    if getattr(err, "code", None) not in RETRY_INSERT:
                        raise
                    self.counters["rate_limited"] += 1

    def _weight_sync(self) -> None:
        while not self.stop.is_set():
            if not self.sync_requested.wait(0.1):
                continue
            self.sync_requested.clear()
            self.weights.fetch()

    def _ship(self, parts: list[dict]) -> bool:
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        request = pb.InsertRequest(tensors=codec.encode_batch(batch), actor=self.ctx.task)
        if self.ctx.cfg.replay.kind == "prioritized":
            priorities = self.algo.initial_priorities(batch).astype(np.float32)
            request.priorities.CopyFrom(codec.encode_array("priorities", priorities))
        return put_until_stopped(self.outbox, request, self.stop)

    def run(self) -> None:
        """Waits for initial weights, then acts until the run stops."""
        cfg, task = self.ctx.cfg, self.ctx.task
        if not self.weights.wait_initialized(self.stop):
            return
        threads = [
            threading.Thread(target=guarded, args=(f, self.stop), daemon=True)
            for f in (self._sender, self._weight_sync)
        ]
        for thread in threads:
            thread.start()
        seed = cfg.run.seed * 10_000 + task * cfg.env.num_envs
        env = make_vector_env(
            cfg.env.id,
            cfg.env.num_envs,
            vector=cfg.env.vector,
            seed=seed,
            max_episode_steps=cfg.env.max_episode_steps,
            kwargs=cfg.env.kwargs,
        )
        rng = np.random.default_rng(seed)
        post = self.algo.postprocessor(cfg.env.num_envs)
        episodes = EpisodeTracker(cfg.env.num_envs)
        module = self.ctx.algorithm_module()
        params = cfg.algorithm.params
        ps0 = self.weights.clients[0]
        obs, _ = env.reset(seed=seed)
        parts, steps, reported = [], 0, 0
        last_report = time.monotonic()
        try:
            while not self.stop.is_set():
                self.weights.swap_in()
                epsilon = module.actor_epsilon(params, task, self.ctx.cluster.actor, steps)
                actions = self.algo.act(obs, epsilon, rng)
                next_obs, rewards, terminated, truncated, infos = env.step(actions)
                done = terminated | truncated
                real_next = final_observations(next_obs, infos, done)
                out = post.add(obs, actions, rewards, real_next, terminated, truncated)
                if out is not None:
                    parts.append(out)
                episodes.step(rewards, done)
                obs = next_obs
                steps += cfg.env.num_envs
                vector_steps = steps // cfg.env.num_envs
                if vector_steps % cfg.actor.weight_sync_every == 0:
                    self.sync_requested.set()
                if vector_steps % cfg.actor.send_every == 0 and parts:
                    if not self._ship(parts):
                        break
                    parts = []
                if time.monotonic() - last_report > 0.5:
                    returns, lengths = episodes.take()
                    reply = ps0.call(
                        "Report",
                        pb.ReportRequest(
                            role="actor",
                            task=task,
                            env_steps=steps - reported,
                            episode_returns=returns,
                            episode_lengths=lengths,
                            stats={"epsilon": epsilon, **self.counters},
                        ),
                    )
                    reported, last_report = steps, time.monotonic()
                    if reply.stopping:
                        log.info("run is stopping")
                        self.stop.set()
        finally:
            self.stop.set()
            env.close()
            for thread in threads:
                thread.join(timeout=5)


def run(ctx) -> int:
    """Runs actor `ctx.task` until the run stops or SIGTERM."""
    import tensorflow as tf

    stop = stop_event_on_signals()
    with tf.device("/CPU:0"):
        algo = ctx.build_algorithm()
        Actor(ctx, algo, stop).run()
    return 1 if stop.error else 0
