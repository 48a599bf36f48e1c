"""Actor: steps a vector of environments with its local copy of the policy.

Threads: the main loop (inference + env step + post-processing), a sender thread
(bounded queue -> memory shard `actor_index % num_memory`) and a weight-sync
thread (PS shards -> a "latest weights" slot the main loop swaps in between
steps).

The algorithm supplies a collector (`act`, then `observe`, per vector step); the
loop around it depends on the algorithm's flow:
- async replay (DQN, IMPALA): act, ship every `send_every` steps, sync weights every
  `weight_sync_every` steps, never wait.
- synchronous rounds (PPO, ES): collect this actor's share of round r with the
  weights of round r, ship it tagged with r, then wait (long-poll, no spinning) for
  the learner to publish round r + 1.
- actor gradients (A3C): no memory and no learner: compute gradients on each
  collected unroll, push them to every PS shard, continue with the values the push
  returns. Actor 0 initializes the PS shards.

With `output.dir` set, `_step` also hands every vector step to an
`easyrl.offline.recorder.Recorder`, which writes whole episodes to the dataset (flushed
when the actor stops, SIGTERM included).
"""

import functools
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from easyrl.envs import env_options, final_observations, make_vector_env
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

    def discard_open(self) -> None:
        """Forgets the unfinished episodes (the envs were reset)."""
        self.returns[:] = 0.0
        self.lengths[:] = 0

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
        memories = len(ctx.cluster.memory)
        self.memory = ctx.client("memory", ctx.task % memories) if memories else None
        self.outbox: queue.Queue = queue.Queue(maxsize=ctx.cfg.actor.queue_size)
        self.sync_requested = threading.Event()
        self.counters = {
            "sent": 0,
            "rate_limited": 0,
            "refused_stale": 0,
            "dropped_stale": 0,
            "dropped_nonfinite": 0,
        }
        self.episodes = EpisodeTracker(ctx.cfg.env.num_envs)
        self.recorder = None
        if ctx.cfg.output.dir is not None:
            from easyrl.offline.recorder import Recorder

            self.recorder = Recorder(
                ctx.cfg, ctx.task, ctx.cluster.actor, ctx.run_dir, *ctx.spaces()
            )
        self._reported_steps = self._reported_updates = 0
        self._last_report = self._last_stop_check = time.monotonic()

    def _sender(self) -> None:
        while not self.stop.is_set():
            try:
                request = self.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                try:
                    reply = self.memory.call("Insert", request)
                    self.counters["refused_stale" if reply.refused else "sent"] += 1
                    break
                except TransportError as err:
                    # Rate limited: the shard refused (RESOURCE_EXHAUSTED) or the call ran out
                    # of time while waiting; send the same batch again (a rare duplicate
                    # transition in replay is harmless, a lost batch is not).
                    if getattr(err, "code", None) not in RETRY_INSERT:
                        raise
                    self.counters["rate_limited"] += 1
                    self._stop_if_run_stopping()

    def _stop_if_run_stopping(self, every_s: float = 2.0) -> None:
        """While inserts are refused the main loop waits on the full outbox and does not
        report, so the sender asks PS shard 0 (at most every `every_s`) whether the run is
        over: once learners stop, the rate limiter refuses inserts forever."""
        now = time.monotonic()
        if now - self._last_stop_check < every_s:
            return
        self._last_stop_check = now
        if self.weights.clients[0].call("Status", pb.StatusRequest()).stopping:
            log.info("run is stopping")
            self.stop.set()

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

    def _report(self, steps: int, stats: dict, force: bool = False, updates: int = 0) -> None:
        """Reports env steps (and, for actor gradients, updates), finished episodes and stats
        to PS shard 0 every half second (or now when `force`); stops the actor when the run
        is stopping."""
        if not force and time.monotonic() - self._last_report < 0.5:
            return
        returns, lengths = self.episodes.take()
        recording = self.recorder is not None
        reply = self.weights.clients[0].call(
            "Report",
            pb.ReportRequest(
                role="actor",
                task=self.ctx.task,
                env_steps=steps - self._reported_steps,
                updates=updates - self._reported_updates,
                episode_returns=returns,
                episode_lengths=lengths,
                stats={**stats, **self.counters, **(self.recorder.stats() if recording else {})},
            ),
        )
        self._reported_steps, self._reported_updates = steps, updates
        self._last_report = time.monotonic()
        if reply.stopping:
            log.info("run is stopping")
            self.stop.set()

    def run(self) -> None:
        """Waits for initial weights, then acts until the run stops."""
        cfg, flow = self.ctx.cfg, self.algo.flow
        peers = [*self.weights.clients, *([self.memory] if self.memory else [])]
        if not self.ctx.wait_for_peers(peers, self.stop):
            return
        if self.ctx.cluster.learner == 0 and self.ctx.task == 0 and self.weights.initialize():
            log.info("actor 0 initialized the PS shards (no learner in this cluster)")
        if not self.weights.wait_initialized(self.stop, cfg.run.peer_timeout_s):
            return
        # The flow's main loop, and the communication threads beside it.
        loop, bodies = {
            "async_replay": (self._replay_loop, (self._sender, self._weight_sync)),
            "sync_rounds": (self._rounds_loop, (self._sender,)),
            "actor_gradients": (self._gradients_loop, ()),
        }[flow]
        threads = [
            threading.Thread(target=guarded, args=(f, self.stop), daemon=True) for f in bodies
        ]
        for thread in threads:
            thread.start()
        seed = cfg.run.seed * 10_000 + self.ctx.task * cfg.env.num_envs
        env = make_vector_env(
            cfg.env.id, cfg.env.num_envs, vector=cfg.env.vector, seed=seed, **env_options(cfg.env)
        )
        try:
            loop(env, seed)
        finally:
            self.stop.set()
            env.close()
            if self.recorder is not None:
                self.recorder.close()
            for thread in threads:
                thread.join(timeout=5)

    def _collector(self, seed: int):
        cfg = self.ctx.cfg
        return self.algo.collector(cfg.env.num_envs, seed, self.ctx.task, self.ctx.cluster.actor)

    def _step(self, env, collector, obs, rng) -> tuple[np.ndarray, dict | None]:
        """One vector step: act, step the envs, observe, count episodes.

        Returns:
            (the observations to act on next, what the collector completed or None).
        """
        actions = collector.act(obs, rng)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        if self.recorder is not None:
            logp = getattr(collector, "last_action_logp", None)
            self.recorder.step(obs, actions, rewards, terminated, truncated, real_next, logp)
        out = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        self.episodes.step(rewards, done)
        return next_obs, out

    def _replay_loop(self, env, seed: int) -> None:
        """Async replay: act, ship every `send_every` steps, refresh weights on the side."""
        cfg = self.ctx.cfg
        rng = np.random.default_rng(seed)
        collector = self._collector(seed)
        obs, _ = env.reset(seed=seed)
        parts, steps = [], 0
        while not self.stop.is_set():
            self.weights.swap_in()
            obs, out = self._step(env, collector, obs, rng)
            if out is not None:
                parts.append(out)
            steps += cfg.env.num_envs
            vector_steps = steps // cfg.env.num_envs
            if vector_steps % cfg.actor.weight_sync_every == 0:
                self.sync_requested.set()
            if vector_steps % cfg.actor.send_every == 0 and parts:
                if not self._ship(parts):
                    return
                parts = []
            self._report(steps, collector.stats())

    def _gradients_loop(self, env, seed: int) -> None:
        """Actor gradients (A3C): gradients of every collected unroll go straight to the PS;
        the push replies carry the new values."""
        cfg = self.ctx.cfg
        rng = np.random.default_rng(seed)
        collector = self._collector(seed)
        obs, _ = env.reset(seed=seed)
        steps, updates, stats = 0, 0, {}
        with ThreadPoolExecutor(max_workers=len(self.weights.clients)) as pool:
            while not self.stop.is_set():
                obs, out = self._step(env, collector, obs, rng)
                steps += cfg.env.num_envs
                if out is not None:
                    grads, stats, _ = self.algo.learn(out, None)
                    self.weights.push_and_swap_in(grads, self.ctx.task, pool, self.counters)
                    updates += 1
                self._report(steps, {**collector.stats(), **stats}, updates=updates)

    def _rounds_loop(self, env, seed: int) -> None:
        """Synchronous rounds: collect this actor's share of round r with the weights of
        round r, ship it tagged with r, wait for round r + 1."""
        cfg, task = self.ctx.cfg, self.ctx.task
        rng = np.random.default_rng(seed)
        share = self.ctx.algorithm_module().round_share(
            cfg.algorithm.params, cfg.env.num_envs, task, self.ctx.cluster.actor
        )
        collector = self._collector(seed)
        round_, steps = self.weights.round, 0
        obs, _ = env.reset(seed=seed)
        while not self.stop.is_set():
            collector.start_round(share)
            batch = None
            while batch is None and not self.stop.is_set():
                obs, batch = self._step(env, collector, obs, rng)
                steps += cfg.env.num_envs
                self._report(steps, {"round": round_})
            if batch is None:
                return
            request = pb.InsertRequest(tensors=codec.encode_batch(batch), actor=task, round=round_)
            if not put_until_stopped(self.outbox, request, self.stop):
                return
            self._report(steps, {"round": round_}, force=True)
            report = functools.partial(self._report, steps, {"round": round_}, True)
            if not self.weights.wait_round(round_ + 1, self.stop, on_wait=report):
                return
            round_ = self.weights.round
            if collector.resets_envs:
                obs, _ = env.reset()
                self.episodes.discard_open()
                if self.recorder is not None:
                    self.recorder.reset()


def run(ctx) -> int:
    """Runs actor `ctx.task` until the run stops or SIGTERM."""
    import tensorflow as tf

    stop = stop_event_on_signals()
    with tf.device("/CPU:0"):
        algo = ctx.build_algorithm()
        Actor(ctx, algo, stop).run()
    return 1 if stop.error else 0
