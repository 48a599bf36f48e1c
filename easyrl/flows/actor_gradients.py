"""Actor gradients (A3C): no memory and no learner. Each actor computes the gradients of
every unroll it collects, pushes them to every PS shard and goes on with the values the push
replies carry. Actor 0 initializes the PS shards."""

from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np

from easyrl.algorithms.contract import GradientsAgent
from easyrl.flows import ActorPlumbing


def act(actor: ActorPlumbing, env, seed: int) -> None:
    """Acts and learns until the run stops."""
    agent = cast(GradientsAgent, actor.algo)
    collector = actor.collector(agent, seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    steps, updates, stats = 0, 0, {}
    with ThreadPoolExecutor(max_workers=len(actor.weights.clients)) as pool:
        while not actor.stop.is_set():
            obs, out = actor.step(env, collector, obs, rng)
            steps += actor.ctx.cfg.env.num_envs
            if out is not None:
                grads, stats, _ = agent.learn(out, None)
                actor.weights.push_and_swap_in(grads, actor.ctx.task, pool, actor.counters)
                updates += 1
            actor.report(steps, {**collector.stats(), **stats}, updates=updates)
