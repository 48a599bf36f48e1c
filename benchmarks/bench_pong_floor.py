"""The compute floor of an IMPALA Pong agent step on this machine, piece by piece.

Each piece runs alone in this process for `--duration` seconds and is charged its CPU time
(all of this process's threads, `time.process_time`), so the figures are core-seconds and
add up across pieces however a run spreads them over processes:

- env: `--num-envs` envs of the config's env (EnvPool with `pong_impala_2core.yaml`),
  random actions, the pool's default threads; CPU per agent step.
- act: the actor's compiled forward pass on a batch of `--num-envs` observations; CPU
  per observation.
- learn: the learner's gradient step (`agent.learn`) on a batch of the config's
  `batch_size` unrolls (random frames); CPU per agent step learned from.

floor = env + act + learn per agent step: no transport, no replay, no Python around the
calls, so no run on these cores steps faster than `cores / floor` agent steps/s. The last
line is `floor: X ms per agent step, at most N agent steps/s on C cores`.

    python benchmarks/bench_pong_floor.py                          # print
    python benchmarks/bench_pong_floor.py --set algorithm.batch_size=4 --write
"""

import argparse
import os
import time
from typing import Any

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

import numpy as np  # noqa: E402
import report  # noqa: E402

SMOKE_LINE = r"^floor: \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def cpu_per_unit(fn, units: int, duration_s: float) -> tuple[float, float]:
    """(CPU seconds per unit, units per wall second) of calling `fn` (`units` each call)
    for `duration_s` after a short warm-up."""
    for _ in range(3):
        fn()
    wall0, cpu0, calls = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - wall0 < duration_s:
        fn()
        calls += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return cpu / (calls * units), calls * units / wall


def random_unrolls(algo, batch_size: int, rng) -> dict:
    """A batch of `batch_size` unrolls of the agent's replay spec with random contents."""
    batch = {}
    for name, (shape, dtype) in algo.spec.items():
        full = (batch_size, *shape)
        if np.issubdtype(dtype, np.integer):
            high = algo.num_actions if name == "action" else 256
            batch[name] = rng.integers(0, high, full).astype(dtype)
        else:
            batch[name] = rng.random(full).astype(dtype)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default=str(report.REPO / "configs" / "pong_impala_2core.yaml"))
    parser.add_argument("--set", action="append", default=[], help="config override")
    parser.add_argument("--num-envs", type=int, default=None, help="default: env.num_envs")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per piece")
    args = report.parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.duration, args.num_envs = 0.2, 2
    started, load_before = time.monotonic(), report.load_average()

    import tensorflow as tf

    from easyrl import config as config_lib
    from easyrl.algorithms import registry
    from easyrl.envs import env_options, make_vector_env
    from easyrl.envs.multiagent import run_spaces

    cfg = config_lib.load(args.config, args.set)
    config_name = os.path.relpath(args.config, report.REPO)
    n = args.num_envs or cfg.env.num_envs
    obs_space, action_space = run_spaces(cfg)
    rng = np.random.default_rng(0)
    per_worker, options = cfg.env.envs_per_worker, env_options(cfg.env)
    env = make_vector_env(
        cfg.env.id, n, vector=cfg.env.vector, seed=0, envs_per_worker=per_worker, **options
    )
    per_worker_note = f" ({per_worker} per subprocess)" if per_worker > 1 else ""
    env.reset(seed=0)
    env_cpu, env_rate = cpu_per_unit(
        lambda: env.step(rng.integers(0, action_space.n, n)), n, args.duration
    )
    env.close()
    with tf.device("/CPU:0"):
        spec = registry.spec(cfg.algorithm.name)
        # An IMPALA agent (its evaluate and learn; the contract's Agent names neither).
        algo: Any = spec.build(cfg.algorithm.params, obs_space, action_space, cfg.model, 0)
        obs = rng.integers(0, 256, (n, *obs_space.shape)).astype(obs_space.dtype)
        act_cpu, act_rate = cpu_per_unit(lambda: algo.evaluate(obs), n, args.duration)
        params = cfg.algorithm.params
        batch = random_unrolls(algo, params.batch_size, rng)
        steps = params.batch_size * params.unroll_length
        learn_cpu, learn_rate = cpu_per_unit(lambda: algo.learn(batch), steps, args.duration)
    cores = os.cpu_count() or 1
    floor = env_cpu + act_cpu + learn_cpu
    rows = [
        ["env", f"{n} envs, {cfg.env.vector}{per_worker_note}", env_cpu * 1e3, env_rate],
        ["act", f"forward pass, batch {n}", act_cpu * 1e3, act_rate],
        [
            "learn",
            f"{params.batch_size} unrolls of {params.unroll_length}",
            learn_cpu * 1e3,
            learn_rate,
        ],
        ["floor", "env + act + learn", floor * 1e3, cores / floor],
    ]
    for piece, what, ms, rate in rows:
        print(f"{piece:>5} ({what}): {ms:.3f} ms CPU per agent step, {rate:,.0f} steps/s alone")
    last = (
        f"floor: {floor * 1e3:.2f} ms per agent step, at most {cores / floor:,.0f} agent "
        f"steps/s on {cores} cores"
    )
    print(last)
    if args.write:
        table = report.markdown_table(
            ["piece", "what", "CPU ms per agent step", "agent steps/s alone (wall)"], rows
        )
        body = (
            f"{table}\n\n- config `{config_name}` {' '.join(args.set)}; each piece alone in "
            f"one process for {args.duration:g} s, charged its process CPU time (all threads). "
            "The floor row's rate is cores / floor: no transport, replay or Python around the "
            f"calls.\n\n`{last}`\n"
        )
        title = "Pong compute floor per agent step"
        report.write_section("pong-floor", report.section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
