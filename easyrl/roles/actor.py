"""Actor: steps a vector of environments with its local copy of the policy.

The loop is the flow's (`easyrl.flows`: `act` of async_replay, sync_rounds or
actor_gradients); this module is its plumbing: the agent's collector (`act`, then `observe`,
per vector step), a sender thread (bounded outbox -> memory shard `actor_index %
num_memory`), a weight-sync thread (PS shards -> a "latest weights" slot the loop swaps in
between steps), and reports of env steps and episodes to PS shard 0.

With `output.dir` set, `step` also hands every vector step to an
`easyrl.offline.recorder.Recorder`, which writes whole episodes to the dataset (flushed
when the actor stops, SIGTERM included).
"""

import logging
import queue
import secrets
import threading
import time
from typing import cast

import grpc
import numpy as np

from easyrl.algorithms import multiagent, registry
from easyrl.algorithms.contract import (
    Agent,
    Collector,
    GradientsAgent,
    PrioritizedAgent,
    ReplayAgent,
    RoundsAgent,
)
from easyrl.algorithms.nstep import PRIORITY
from easyrl.envs import env_options, final_observations, game_steps, make_vector_env
from easyrl.envs.multiagent import SlotVectorEnv
from easyrl.errors import MessageTooLarge, TransportError
from easyrl.flows import actor_gradients, async_replay, sync_rounds
from easyrl.replay.frames import layout_for
from easyrl.roles.common import (
    RoleContext,
    ShardedWeights,
    StopSignal,
    put_until_stopped,
    stop_event_on_signals,
)
from easyrl.seeds import derive_seed

log = logging.getLogger(__name__)

RETRY_INSERT = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)


class EpisodeTracker:
    """Accumulates per-env returns and lengths; hands out finished episodes (with the policy
    of each env's agent, `policies`, in a multi-agent run: an env is then a slot)."""

    def __init__(self, num_envs: int, policies: list[str] | None = None):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.multiagent = policies is not None
        self.policies = np.array(policies if policies is not None else [""] * num_envs)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.finished_policies: list[str] = []

    def discard_open(self) -> None:
        """Forgets the unfinished episodes (the envs were reset)."""
        self.returns[:] = 0.0
        self.lengths[:] = 0

    def step(self, rewards: np.ndarray, done: np.ndarray, acted: np.ndarray | None = None) -> None:
        """Adds one vector step's rewards; closes the episodes of envs that are done.
        `acted` `[N]`: the slots whose agents acted (the others' episodes do not grow)."""
        self.returns += rewards
        self.lengths += 1 if acted is None else acted
        self.finished_returns.extend(self.returns[done].tolist())
        self.finished_lengths.extend(self.lengths[done].tolist())
        self.finished_policies.extend(self.policies[done].tolist())
        self.returns[done] = 0.0
        self.lengths[done] = 0

    def take(self) -> tuple[list[float], list[int], list[str]]:
        """Returns and clears the finished episodes: (returns, lengths, policies; the
        policies are empty in a single-agent run)."""
        policies = self.finished_policies if self.multiagent else []
        out = (self.finished_returns, self.finished_lengths, policies)
        self.finished_returns, self.finished_lengths, self.finished_policies = [], [], []
        return out


class Actor:
    """The actor's loops (see the module docstring).

    Args:
        ctx: the role context.
        algo: the built agent; its `flow` picks the loop, and the loop uses it as that
            flow's protocol (`easyrl.algorithms.contract`).
        stop: set to stop every loop.
    """

    def __init__(self, ctx: RoleContext, algo: Agent, stop: StopSignal):
        self.ctx = ctx
        self.algo = algo
        self.stop = stop
        self.weights = ShardedWeights(ctx.clients("ps"), algo.variables)
        memories = len(ctx.cluster.memory)
        self.memory = ctx.client("memory", ctx.task % memories) if memories else None
        self.frames = None  # frame stacks ship as distinct frames + indexes (replay.frames)
        if memories and ctx.cfg.env.atari is not None:
            self.frames = layout_for(ctx.cfg, registry.replay_spec(ctx.cfg, *ctx.spaces()))
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

    def send_loop(self) -> None:
        """The sender thread: outbox -> memory shard; a rate-limited insert is sent again."""
        assert self.memory is not None, "the sender runs only with memory shards"
        sender, sequence = secrets.randbits(63) | 1, 0  # this incarnation's id, never 0
        while not self.stop.is_set():
            try:
                batch, priorities, round_ = self.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            sequence += 1  # a resend keeps it: the shard stores the batch once
            while not self.stop.is_set():
                try:
                    kept = self.memory.insert(
                        batch, priorities, self.ctx.task, round_, sender, sequence
                    )
                    self.counters["sent" if kept else "refused_stale"] += 1
                    break
                except TransportError as err:
                    # Rate limited: the shard refused (RESOURCE_EXHAUSTED) or the call ran out
                    # of time while waiting; send the same batch again (with its sequence
                    # number: stored once even if the first attempt was stored after all).
                    if err.code not in RETRY_INSERT or isinstance(err, MessageTooLarge):
                        raise
                    self.counters["rate_limited"] += 1
                    self._stop_if_run_stopping()

    def _stop_if_run_stopping(self, every_s: float = 0.5) -> None:
        """While inserts are refused the main loop waits on the full outbox and does not
        report, so the sender asks PS shard 0 (at most every `every_s`) whether the run is
        over: once learners stop, the rate limiter refuses inserts forever."""
        now = time.monotonic()
        if now - self._last_stop_check < every_s:
            return
        self._last_stop_check = now
        self.check_stopping()

    def check_stopping(self) -> None:
        """Stops the actor when PS shard 0 says the run is stopping: a Status call, which
        changes none of the run's counters (a wait for the next round, see
        `easyrl.flows.sync_rounds`)."""
        if self.weights.clients[0].status().stopping:
            log.info("run is stopping")
            self.stop.set()

    def weight_sync_loop(self) -> None:
        """The weight-sync thread: fetches the PS shards' values when the loop asks."""
        while not self.stop.is_set():
            if not self.sync_requested.wait(0.1):
                continue
            self.sync_requested.clear()
            self.weights.fetch()

    def ship(self, batch: dict, round_: int = 0) -> bool:
        """Queues `batch` for the memory shard, tagged with its round (synchronous rounds),
        with initial priorities when the replay is prioritized; Atari frame stacks go as
        their distinct frames (`replay.frames.FrameLayout.pack`).

        Returns:
            False if the actor stopped before the outbox had room.
        """
        priorities = batch.get(PRIORITY)  # the collector's, if it computed them
        batch = {k: v for k, v in batch.items() if k != PRIORITY}
        if not self.ctx.cfg.replay.prioritized:
            priorities = None
        elif priorities is None:
            agent = cast(PrioritizedAgent, self.algo)
            priorities = agent.initial_priorities(batch).astype(np.float32)
        if self.frames is not None:
            batch = self.frames.pack(batch)
        return put_until_stopped(self.outbox, (batch, priorities, round_), self.stop)

    def report(self, steps: int, stats: dict, force: bool = False, updates: int = 0) -> None:
        """Reports env steps (and, for actor gradients, updates), finished episodes and stats
        to PS shard 0 every half second (or now when `force`); stops the actor when the run
        is stopping."""
        if not force and time.monotonic() - self._last_report < 0.5:
            return
        returns, lengths, policies = self.episodes.take()
        recorded = self.recorder.stats() if self.recorder is not None else {}
        stopping = self.weights.clients[0].report(
            "actor",
            self.ctx.task,
            env_steps=steps - self._reported_steps,
            updates=updates - self._reported_updates,
            episode_returns=returns,
            episode_lengths=lengths,
            episode_policies=policies,
            stats={**stats, **self.counters, **recorded},
        )
        self._reported_steps, self._reported_updates = steps, updates
        self._last_report = time.monotonic()
        if stopping:
            log.info("run is stopping")
            self.stop.set()

    def run(self) -> None:
        """Waits for initial weights, then runs the flow's loop until the run stops."""
        cfg = self.ctx.cfg
        peers = [*self.weights.clients, *([self.memory] if self.memory else [])]
        if not self.ctx.wait_for_peers(peers, self.stop):
            return
        if self.ctx.cluster.learner == 0 and self.ctx.task == 0 and self.weights.initialize():
            log.info("actor 0 initialized the PS shards (no learner in this cluster)")
        if not self.weights.wait_initialized(self.stop, cfg.run.peer_timeout_s):
            return
        seed = derive_seed(cfg.run.seed, "actor", self.ctx.task)
        env = self.make_env(seed)
        try:
            LOOPS[self.algo.flow](self, env, seed)
        finally:
            self.stop.set()
            env.close()
            if self.recorder is not None:
                self.recorder.close()

    def make_env(self, seed: int):
        """The actor's vector env; a multi-agent run's `SlotVectorEnv` (slot = env copy x
        agent), whose episodes are then counted per slot and policy."""
        cfg = self.ctx.cfg
        if not cfg.multiagent.enabled:
            options = env_options(cfg.env)
            return make_vector_env(
                cfg.env.id,
                cfg.env.num_envs,
                vector=cfg.env.vector,
                seed=seed,
                envs_per_worker=cfg.env.envs_per_worker,
                **options,
            )
        env = SlotVectorEnv(
            cfg.env.id,
            cfg.env.num_envs,
            cfg.env.kwargs,
            cfg.env.max_episode_steps,
            cfg.multiagent.agent_id,
        )
        slots = np.tile(multiagent.slot_policies(cfg.multiagent, env.agents), cfg.env.num_envs)
        self.episodes = EpisodeTracker(env.num_envs, [cfg.multiagent.policies[p] for p in slots])
        return env

    def collector(self, agent: ReplayAgent | RoundsAgent | GradientsAgent, seed: int):
        """The collector of this actor (`num_envs` envs, actor `task` of all actors)."""
        cfg, cluster = self.ctx.cfg, self.ctx.cluster
        return agent.collector(cfg.env.num_envs, seed, self.ctx.task, cluster.actor)

    def step(self, env, collector: Collector, obs, rng) -> tuple[np.ndarray, dict | None]:
        """One vector step: act, step the envs, observe, count episodes.

        Returns:
            (the observations to act on next, what the collector completed or None).
        """
        acted = None  # multi-agent: the slots whose agents act on `obs`
        if isinstance(env, SlotVectorEnv) and isinstance(collector, multiagent.SlotCollector):
            acted = collector.present = env.present.copy()
        actions = collector.act(obs, rng)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        if self.recorder is not None:
            self.recorder.step(
                obs, actions, rewards, terminated, truncated, real_next, collector.last_action_logp
            )
        out = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        game = game_steps(infos, len(done))  # Atari: whole games, raw scores
        self.episodes.step(*(game or (rewards, done)), acted)
        return next_obs, out

    def discard_open_episodes(self) -> None:
        """Forgets the unfinished episodes (the loop reset the envs)."""
        self.episodes.discard_open()
        if self.recorder is not None:
            self.recorder.reset()


LOOPS = {
    "async_replay": async_replay.act,
    "sync_rounds": sync_rounds.act,
    "actor_gradients": actor_gradients.act,
}
"""The actor's loop of each flow."""


def run(ctx) -> int:
    """Runs actor `ctx.task` until the run stops or SIGTERM."""
    import tensorflow as tf

    stop = stop_event_on_signals()
    with tf.device("/CPU:0"):
        algo = ctx.build_algorithm()
        Actor(ctx, algo, stop).run()
    return 1 if stop.error else 0
