"""Evaluator: the greedy/deterministic policy of the newest weights on fresh environments.

Every `eval.interval_s` it pulls the newest weights from the PS shards, runs
`eval.episodes` whole episodes with `algo.greedy` on its own vector of environments
(seeded apart from the actors'; Atari without episodic life or reward clipping, so the
returns are game scores), reports the returns to PS shard 0 (they appear as
`eval_return_mean` in the progress line, `metrics.jsonl` and TensorBoard, and can stop
the run: `stop.eval_return_mean`) and keeps the weights of the best evaluation so far
in `checkpoints/best.npz`. Works with every algorithm: it only needs `greedy`.

In an offline run (`input.dir`) whose algorithm's spec sets `action_logp` (a `LogpAgent`:
its agent has `action_logp(obs, actions)`) and whose dataset holds
behaviour probabilities, each evaluation also estimates the learned policy's return on a
fixed sample of logged episodes by importance sampling (`easyrl.offline.ope`) and reports
it with the returns: `evaluator/eval_ope_is` and `evaluator/eval_ope_wis` in the metrics.
"""

import json
import logging
import threading
from pathlib import Path

import numpy as np

from easyrl.atomic import save_npz
from easyrl.envs import evaluation_options, make_vector_env
from easyrl.envs.evaluation import play_episodes
from easyrl.offline.ope import OffPolicyEvaluator
from easyrl.roles.common import RoleContext, ShardedWeights, stop_event_on_signals
from easyrl.seeds import derive_seed

log = logging.getLogger(__name__)


class BestCheckpoint:
    """The weights of the best evaluation so far, as `checkpoints/best.npz` (written to a
    temporary file, then renamed).

    Args:
        path: the checkpoint file; a previous one is loaded, so a restarted evaluator
            only replaces it with something better.
    """

    def __init__(self, path: Path):
        self.path = path
        self.best = -np.inf
        if path.exists():
            with np.load(path) as data:
                self.best = float(json.loads(data["meta"].tobytes())["eval_return_mean"])

    def offer(self, mean: float, variables: dict, meta: dict) -> bool:
        """Saves the variables when `mean` beats the best so far; returns whether it did."""
        if not mean > self.best:
            return False
        arrays = {f"var/{name}": v.numpy() for name, v in variables.items()}
        meta = {**meta, "eval_return_mean": mean}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        save_npz(self.path, arrays)
        self.best = mean
        return True


def evaluate_forever(ctx: RoleContext, algo, stop: threading.Event) -> None:
    """The evaluator's loop (see the module docstring)."""
    from easyrl.algorithms.agent_parts import greedy_policy

    cfg = ctx.cfg
    weights = ShardedWeights(ctx.clients("ps"), algo.variables)
    if not ctx.wait_for_peers(weights.clients, stop):
        return
    if not weights.wait_initialized(stop, cfg.run.peer_timeout_s):
        return
    options = evaluation_options(cfg.env)
    seed = derive_seed(cfg.run.seed, "evaluator", ctx.task)
    env = make_vector_env(
        cfg.env.id,
        cfg.eval.num_envs,
        vector=cfg.env.vector,
        seed=seed,
        envs_per_worker=cfg.env.envs_per_worker,
        **options,
    )
    best = BestCheckpoint(ctx.run_dir / "checkpoints" / "best.npz")
    ope = OffPolicyEvaluator.from_config(cfg, ctx.algorithm_spec())
    ps0 = weights.clients[0]
    evaluation = 0
    try:
        while not stop.is_set():
            weights.fetch()
            weights.swap_in()
            versions = list(weights.local_versions)
            returns, _ = play_episodes(
                env,
                greedy_policy(algo, bool(cfg.model.lstm)),  # a recurrent one: zero state
                cfg.eval.episodes,
                derive_seed(cfg.run.seed, "evaluator", ctx.task, evaluation),
                stop,
            )
            if len(returns) < cfg.eval.episodes:
                break
            mean = float(np.mean(returns))
            estimates = ope.estimate(algo.action_logp) if ope is not None else {}
            stopping = ps0.report("evaluator", ctx.task, eval_returns=returns, stats=estimates)
            saved = best.offer(mean, algo.variables, {"versions": versions, "returns": returns})
            log.info(
                "evaluation %d: mean return %.1f over %d episodes (PS versions %s)%s%s",
                evaluation,
                mean,
                len(returns),
                versions,
                "".join(f", {k} {v:.1f}" for k, v in estimates.items()),
                "; best so far, saved" if saved else "",
            )
            evaluation += 1
            if stopping:
                log.info("run is stopping")
                break
            stop.wait(cfg.eval.interval_s)
    finally:
        env.close()


def run(ctx) -> int:
    """Runs evaluator `ctx.task` until the run stops or SIGTERM."""
    import tensorflow as tf

    stop = stop_event_on_signals()
    with tf.device("/CPU:0"):
        algo = ctx.build_algorithm()
        evaluate_forever(ctx, algo, stop)
    return 1 if stop.error else 0
