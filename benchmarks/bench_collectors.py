"""Collector hot path: CPU time per vector step of `act` + `observe` (no env, no servers).

Each collector (IMPALA, PPO with and without an LSTM, R2D2) steps N envs' random
observations (5 % episode ends) with TensorFlow on one thread; a measurement is the best of
`--blocks` blocks of 200 vector steps, in process CPU time (less sensitive than wall time to
other processes on a shared machine, still noisy). With `--trees A,B` each tree (a checkout
whose `easyrl` package is imported through PYTHONPATH) is measured `--rounds` times, one
child process each, alternating A, B, A, B, ...; the table gives each tree's best.

    python benchmarks/bench_collectors.py                      # this checkout
    python benchmarks/bench_collectors.py --trees /tmp/before,.  # before/after, alternating
    python benchmarks/bench_collectors.py --smoke                # seconds (the tests')
"""

import argparse
import os
import subprocess
import sys
import time

import report

SMOKE_LINE = r"^r2d2-lstm \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py): the last case's figure."""

CASES: tuple[str, ...] = ("impala", "impala-lstm", "ppo", "ppo-lstm", "r2d2-lstm")


def build(case: str, num_envs: int):
    """The collector of `case` for `num_envs` envs on 4-dim observations, 2 actions."""
    import gymnasium as gym
    import numpy as np

    from easyrl.algorithms import impala, ppo, r2d2
    from easyrl.config import ModelConfig

    box = gym.spaces.Box(-5.0, 5.0, (4,), np.float32)
    actions = gym.spaces.Discrete(2)
    model = ModelConfig(hidden=(64,), lstm=64 if case.endswith("lstm") else 0)
    if case.startswith("impala"):
        agent = impala.build(impala.Params(unroll_length=20), box, actions, model, seed=1)
    elif case.startswith("ppo"):
        agent = ppo.build(ppo.Params(rollout_length=128), box, actions, model, seed=1)
    else:
        agent = r2d2.build(r2d2.Params(), box, actions, model, seed=1)
    return agent.collector(num_envs, 0, 0, 1)


def measure(case: str, num_envs: int, blocks: int) -> float:
    """Best CPU microseconds per vector step over `blocks` blocks of 200 steps."""
    import numpy as np

    collector = build(case, num_envs)
    rng = np.random.default_rng(0)
    steps = 200 * blocks + 50
    obs = rng.normal(size=(steps + 1, num_envs, 4)).astype(np.float32)
    done = rng.random((steps, num_envs)) < 0.05
    reward, no = np.ones(num_envs, np.float32), np.zeros(num_envs, bool)

    def step(i: int) -> None:
        collector.act(obs[i], rng)
        collector.observe(reward, obs[i + 1], obs[i + 1], done[i], no)

    for i in range(50):  # tracing
        step(i)
    best = float("inf")
    for b in range(blocks):
        start = time.process_time()
        for i in range(50 + 200 * b, 50 + 200 * (b + 1)):
            step(i)
        best = min(best, (time.process_time() - start) / 200 * 1e6)
    return best


def child(num_envs: int, blocks: int) -> None:
    """Measures every case in this process and prints `case microseconds` lines."""
    from easyrl.tfimport import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    for case in CASES:
        print(case, f"{measure(case, num_envs, blocks):.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=8, help="blocks of 200 vector steps")
    parser.add_argument("--trees", default="", help="comma list of checkouts to alternate")
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree (with --trees)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    report.add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:  # every case, one block of 200 vector steps of 2 envs, this checkout
        args.num_envs, args.blocks, args.trees = 2, 1, ""
    if args.child or not args.trees:
        child(args.num_envs, args.blocks)
        return
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    best: dict[str, dict[str, float]] = {t: dict.fromkeys(CASES, float("inf")) for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "2"}
            command = [sys.executable, __file__, "--child", f"--num-envs={args.num_envs}"]
            out = subprocess.run(
                [*command, f"--blocks={args.blocks}"], env=env, capture_output=True, text=True
            )
            if out.returncode:
                sys.exit(f"{tree}: {out.stderr[-2000:]}")
            for line in out.stdout.splitlines():
                case, micros = line.split()
                best[tree][case] = min(best[tree][case], float(micros))
    print(f"load average {os.getloadavg()[0]:.1f}; CPU us per vector step of {args.num_envs} envs")
    print("| collector | " + " | ".join(trees) + " |")
    print("|---" * (len(trees) + 1) + "|")
    for case in CASES:
        print(f"| {case} | " + " | ".join(f"{best[t][case]:.0f}" for t in trees) + " |")


if __name__ == "__main__":
    main()
