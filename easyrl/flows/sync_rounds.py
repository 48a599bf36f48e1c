"""Synchronous rounds (PPO, ES): round r is collected with the weights of round r only.

Each actor collects its share of round r, ships it tagged with r and waits (long-poll, no
spinning) for round r + 1. The one learner takes the whole of round r from every memory
shard, runs the agent's round of updates (each update's gradients pushed to every PS shard
and the new values swapped in before the next), then publishes round r + 1 on every PS shard,
which releases the actors.
"""

import collections
import logging
from typing import cast

import numpy as np

from easyrl.algorithms import registry
from easyrl.algorithms.contract import RoundsAgent
from easyrl.flows import ActorPlumbing, LearnerPlumbing
from easyrl.roles.common import threads_running
from easyrl.seeds import derive_seed

log = logging.getLogger(__name__)


def act(actor: ActorPlumbing, env, seed: int) -> None:
    """Collects, ships and waits, round after round, until the run stops."""
    cfg, task = actor.ctx.cfg, actor.ctx.task
    share = registry.round_share(cfg, task, actor.ctx.cluster.actor)
    collector = actor.collector(cast(RoundsAgent, actor.algo), seed)
    rng = np.random.default_rng(seed)
    round_, steps = actor.weights.round, 0
    obs, _ = env.reset(seed=seed)
    with threads_running(actor.stop, actor.send_loop):
        while not actor.stop.is_set():
            collector.start_round(share)
            batch = None
            while batch is None and not actor.stop.is_set():
                obs, batch = actor.step(env, collector, obs, rng)
                steps += cfg.env.num_envs
                actor.report(steps, {"round": round_})
            if batch is None:
                return
            # The round's steps and episodes reach PS shard 0 before its items can reach the
            # learner; waiting reports nothing more (a Status call only: is the run over?),
            # so what PS shard 0 holds when the next round is published is fixed.
            actor.report(steps, {"round": round_}, True)
            if not actor.ship(batch, round_):
                return
            if not actor.weights.wait_round(round_ + 1, actor.stop, actor.check_stopping):
                return
            round_ = actor.weights.round
            if collector.resets_envs:
                obs, _ = env.reset()
                actor.discard_open_episodes()


def learn(learner: LearnerPlumbing) -> None:
    """Takes round r, trains on it, publishes round r + 1, until the run stops."""
    agent = cast(RoundsAgent, learner.algo)
    rng = np.random.default_rng(derive_seed(learner.ctx.cfg.run.seed, "learner", learner.ctx.task))
    round_ = learner.weights.round
    while not learner.stop.is_set():
        batch, found = learner.take_round(round_)
        if batch is None:
            if found > round_:  # resumed behind the memories: skip to their round
                log.info("memory collects round %d; publishing it", found)
                round_ = found
                learner.publish(round_)
            elif found < 0:  # a memory shard restarted mid-round: collect it anew
                log.warning("round %d lost items on a restarted memory shard", round_)
                learner.counters["abandoned_rounds"] += 1
                round_ += 1
                learner.publish(round_)
            continue
        totals, steps = collections.Counter(), 0
        for grads, stats, _ in agent.learn_round(batch, rng):
            learner.weights.push_and_swap_in(
                grads, learner.ctx.task, learner.pool, learner.counters
            )
            learner.updates += 1
            totals.update(stats)
            steps += 1
            if learner.stop.is_set():
                return
        changed = agent.end_round(batch)  # e.g. observation statistics
        if changed:
            learner.weights.assign_local(changed)
        round_ += 1
        # Reported before publishing: the round's stats are in before the actors go on.
        means = {k: v / max(steps, 1) for k, v in totals.items()}  # the round's mean stats
        learner.report({**means, "round": float(round_), "updates_per_round": float(steps)})
        learner.publish(round_)
