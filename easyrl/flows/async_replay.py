"""Async replay: actors act and ship without waiting; learners sample, learn and push
without waiting for the actors (DQN/Ape-X, IMPALA, DDPG/TD3, SAC, offline learners).

Actor threads: the loop below (act, ship every `send_every` vector steps, ask for new weights
every `weight_sync_every`), a sender (outbox -> memory shard) and a weight sync (PS shards ->
the slot `swap_in` reads). Learner threads: one prefetch per memory shard (Sample -> batch
queue), the loop below (one compiled gradient step per batch), push threads (gradients to
every PS shard in parallel) and a priority thread (new priorities back to the shard that
issued the keys). Bounded queues between them make back-pressure explicit.

The loop computes the next gradient while earlier pushes travel or wait in a PS shard's
queue (the shards answer a push once they queued it, with their newest applied values): each
gradient goes with the shard versions of the values it was computed against, so the shards
count its staleness, the pushes queued ahead of it included. A target sync copies the values
the next gradient is computed against.
"""

import functools
from typing import cast

import numpy as np

from easyrl.algorithms.contract import ReplayAgent, ReplayLearner, concat
from easyrl.errors import EasyRLError
from easyrl.flows import ActorPlumbing, LearnerPlumbing
from easyrl.roles.common import put_until_stopped, settle_heap, threads_running


def act(actor: ActorPlumbing, env, seed: int) -> None:
    """Acts until the run stops: ship every `send_every` vector steps, refresh the weights
    on the side every `weight_sync_every`."""
    cfg = actor.ctx.cfg
    collector = actor.collector(cast(ReplayAgent, actor.algo), seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    parts, steps = [], 0
    with threads_running(actor.stop, actor.send_loop, actor.weight_sync_loop):
        while not actor.stop.is_set():
            actor.weights.swap_in()
            obs, out = actor.step(env, collector, obs, rng)
            if out is not None:
                parts.append(out)
            steps += cfg.env.num_envs
            vector_steps = steps // cfg.env.num_envs
            if vector_steps % cfg.actor.weight_sync_every == 0:
                actor.sync_requested.set()
            if vector_steps % cfg.actor.send_every == 0 and parts:
                batch = concat(parts)
                if not actor.ship(batch):
                    return
                parts = []
            actor.report(steps, collector.stats())


def learn(learner: LearnerPlumbing) -> None:
    """Learns from sampled batches until the run stops; syncs the target networks every
    `target_update_period` updates."""
    cfg, stop = learner.ctx.cfg, learner.stop
    agent = cast(ReplayLearner, learner.algo)
    period = agent.target_update_period  # 0: no target network
    if period:
        agent.sync_target()
    targets_in_step = learner.fuse_update()
    prefetch = [functools.partial(learner.prefetch, i) for i in range(len(learner.memories))]
    with threads_running(stop, *prefetch, *learner.update_threads(), learner.priority_loop):
        while not stop.is_set():
            taken = learner.take_batch()
            if taken is None:
                continue
            sample = taken.sample
            versions = learner.values_for_update()
            grads, stats, priorities = agent.learn(sample.data, sample.weights)
            if not learner.apply(grads, versions):
                break
            if cfg.replay.prioritized:
                if priorities is None:
                    raise EasyRLError(f"{cfg.algorithm.name} computed no priorities")
                item = (taken.shard, sample.keys, priorities.astype(np.float64))
                put_until_stopped(learner.priorities, item, stop)
            learner.updates += 1
            if period and not targets_in_step and learner.updates % period == 0:
                learner.weights.swap_in()
                agent.sync_target()
            if learner.updates == 1:  # every compiled call of an update traced
                settle_heap()
            if learner.report_due():
                learner.report(stats)
