"""The compute floor of an IMPALA Pong agent step on this machine, piece by piece.

Each piece runs alone for `--duration` seconds in a process of its own, set up as the
launcher sets up the process of the role that runs it in the config's cluster on this host
(`PIECES`): that role's thread budget (TensorFlow's pools, `easyrl.cluster.threads`) and
the launcher's malloc settings. A piece is charged its CPU time (all of its process's
threads, `time.process_time`), so the figures are core-seconds and add up across pieces
however a run spreads them over processes:

- env: `--num-envs` envs of the config's env (EnvPool with `pong_impala_2core.yaml`),
  random actions, the pool's default threads; CPU per agent step.
- act: the actor's compiled forward pass on a batch of `--num-envs` observations; CPU
  per observation.
- learn: the learner's gradient step (`agent.learn`) on a batch of the config's
  `batch_size` unrolls (random frames); CPU per agent step learned from.

floor = env + act + learn per agent step: no transport, no replay, no Python around the
calls, so no run on these cores steps faster than `cores / floor` agent steps/s. The last
line is `floor: X ms per agent step, at most N agent steps/s on C cores`.

One more piece is printed beside the floor, not counted in it:

- env+act: the two actor pieces alternating, as an actor's loop runs them (a vector step of
  the envs, then the forward pass on the observations it returned), in one process; CPU
  per agent step. The act piece alone runs its forward passes back to back; between an
  actor's forward passes the envs run, and a pass that follows other work costs more CPU
  than one that follows a pass. The line `interleaving: env+act X ms per agent step, R x
  env + act alone` gives that cost.

`--against-cluster R` instead compares the config's own cluster with the floor, in one run:
R rounds, each the floor (this script without the option, in a child process) then the
cluster (`bench_scaling.measure_point`: every role its own process of the local launcher, as
`bench_scaling.py --config CONFIG` measures it, the config's counts, `--cluster-duration`
seconds after the first update and a 5 s warm-up; on the CPU, as the floor). The machine's
speed drifts by tens of percent within minutes, so one pair says little. Under each round a
line says where the cluster's time went per agent step: each role's CPU beside the floor
pieces it runs (the actors' beside env + act alone and alternating), and the cores left
idle; they add up to cores / agent steps/s. The last line is then the median over the
rounds, `cluster/floor: R (median of N rounds, lo-hi; cluster agent steps/s over cores /
floor, 2a/1m/1l/1ps)`.

    python benchmarks/bench_pong_floor.py                          # print
    python benchmarks/bench_pong_floor.py --set algorithm.batch_size=4 --write
    python benchmarks/bench_pong_floor.py --against-cluster 5      # issue 45's 0.9
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

import numpy as np  # noqa: E402
import procs  # noqa: E402
import report  # noqa: E402

SMOKE_LINE = r"^cluster/floor: \d"
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


PIECES = {"env": "actor", "act": "actor", "learn": "learner", "interleaved": "actor"}
"""Each piece and the role whose process runs it in the cluster (`interleaved`: the env+act
row, env and act alternating; not part of the floor)."""
PIECE_LINE = re.compile(r"^piece (\w+): (\S+) (\S+)$", re.MULTILINE)
"""What a piece's child process prints: CPU seconds per agent step, agent steps per second."""


def piece_in_child(piece: str, args, threads: int) -> tuple[float, float]:
    """(CPU seconds per agent step, agent steps/s) of `piece`, measured in a child process
    set up as the launcher sets up the process of the role that runs it: its thread budget
    (`threads`, in `EASYRL_THREADS`) and the launcher's malloc settings (this process's,
    see `main`)."""
    from easyrl.cluster.threads import THREADS_ENV

    cmd = [sys.executable, __file__, f"--piece={piece}", f"--config={args.config}"]
    cmd += [f"--duration={args.duration}", *(f"--set={s}" for s in args.set)]
    cmd += ["--num-envs", str(args.num_envs)] if args.num_envs else []
    env = {**os.environ, THREADS_ENV: str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = PIECE_LINE.search(done.stdout)
    if done.returncode or found is None or found.group(1) != piece:
        raise RuntimeError(f"piece {piece} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return float(found.group(2)), float(found.group(3))


def run_piece(piece: str, args) -> tuple[float, float]:
    """Measures `piece` in this process, on the thread budget in `EASYRL_THREADS`."""
    from easyrl import config as config_lib
    from easyrl.envs import env_options, make_vector_env
    from easyrl.envs.multiagent import run_spaces

    cfg = config_lib.load(args.config, args.set)
    n = args.num_envs or cfg.env.num_envs
    obs_space, action_space = run_spaces(cfg)
    rng = np.random.default_rng(0)
    if piece == "learn":
        return with_network(piece, args, cfg, obs_space, action_space, n, None)
    if piece == "act":  # on random frames
        obs = rng.integers(0, 256, (n, *obs_space.shape)).astype(obs_space.dtype)
        return with_network(piece, args, cfg, obs_space, action_space, n, lambda a: a.evaluate(obs))
    per_worker, options = cfg.env.envs_per_worker, env_options(cfg.env)
    env = make_vector_env(
        cfg.env.id, n, vector=cfg.env.vector, seed=0, envs_per_worker=per_worker, **options
    )
    env.reset(seed=0)
    try:
        if piece == "env":
            return cpu_per_unit(
                lambda: env.step(rng.integers(0, action_space.n, n)), n, args.duration
            )
        return with_network(  # interleaved: act on the frames of one vector step of the envs
            piece,
            args,
            cfg,
            obs_space,
            action_space,
            n,
            lambda a: a.evaluate(env.step(rng.integers(0, action_space.n, n))[0]),
        )
    finally:
        env.close()


def with_network(
    piece: str, args, cfg, obs_space, action_space, n: int, act: Callable[[Any], Any] | None
) -> tuple[float, float]:
    """(CPU seconds per agent step, agent steps/s) of a piece that calls the agent's network
    (built on the piece's role's thread budget): `act(agent)` per vector step of `n` envs
    (the act and interleaved pieces), or with `act` None (learn) the gradient step on a
    batch of random unrolls."""
    import tensorflow as tf

    from easyrl.algorithms import registry
    from easyrl.cluster.threads import process_budget
    from easyrl.roles.common import limit_tf_threads

    limit_tf_threads(process_budget(PIECES[piece], cfg.cluster.threads)[0])
    with tf.device("/CPU:0"):
        spec = registry.spec(cfg.algorithm.name)
        # An IMPALA agent (its evaluate and learn; the contract's Agent names neither).
        algo: Any = spec.build(cfg.algorithm.params, obs_space, action_space, cfg.model, 0)
        if act is not None:
            return cpu_per_unit(lambda: act(algo), n, args.duration)
        params = cfg.algorithm.params
        batch = random_unrolls(algo, params.batch_size, np.random.default_rng(0))
        steps = params.batch_size * params.unroll_length
        return cpu_per_unit(lambda: algo.learn(batch), steps, args.duration)


ROW_LINE = re.compile(r"^ *([\w+]+) \(.*\): ([\d.]+) ms CPU per agent step", re.MULTILINE)
"""A row of the floor's table (piece, CPU ms per agent step), what `--against-cluster` reads
of each child's run: the floor's own row and the pieces it sets beside the cluster's roles."""


def breakdown(rows: dict[str, float], result: dict, cores: int) -> str:
    """Where a cluster's wall time on `cores` goes, per agent step: each role's CPU beside
    the floor pieces it runs (`rows`, ms), and the cores it left idle. They add up to
    `cores / agent steps/s`, so the round's ratio is the floor over their sum."""
    ms = {role: 1e3 * c / max(result["steps"], 1e-9) for role, c in result["cores"].items()}
    idle = 1e3 * (cores - result["cluster_cores"]) / max(result["steps"], 1e-9)
    return (
        f"  ms CPU per agent step: actors {ms.get('actor', 0.0):.3f} (env + act alone "
        f"{rows['env'] + rows['act']:.3f}, alternating {rows['env+act']:.3f}), learner "
        f"{ms.get('learner', 0.0):.3f} (learn alone {rows['learn']:.3f}), memory "
        f"{ms.get('memory', 0.0):.3f}, ps {ms.get('ps', 0.0):.3f}, cores left idle {idle:.3f}"
    )


def against_cluster(args, overrides: list[str]) -> str:
    """`args.against_cluster` rounds of the floor (this script without the option, a child
    process: this one imports no TensorFlow) then the config's own cluster; prints each round
    and returns the last line (the median ratio)."""
    import bench_scaling

    from easyrl import config as config_lib

    counts = bench_scaling.config_counts(config_lib.load(args.config, overrides).cluster)
    point = argparse.Namespace(
        config_path=Path(args.config).resolve(),
        overrides=overrides,
        warmup=args.cluster_warmup,
        duration=args.cluster_duration,
    )
    floor_cmd = [sys.executable, __file__, f"--config={args.config}"]
    floor_cmd += [f"--duration={args.duration}", *(f"--set={s}" for s in args.set)]
    floor_cmd += ["--num-envs", str(args.num_envs)] if args.num_envs else []
    ratios, cores = [], os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="easyrl-floor-") as tmp:
        for i in range(args.against_cluster):
            done = subprocess.run(floor_cmd, capture_output=True, text=True, check=True)
            rows = {piece: float(ms) for piece, ms in ROW_LINE.findall(done.stdout)}
            if {"env", "act", "learn", "floor", "env+act"} - set(rows):
                raise RuntimeError(f"floor rows missing in:\n{done.stdout}")
            floor_ms = rows["floor"]
            result = bench_scaling.measure_point(point, counts, Path(tmp) / f"round-{i}")
            ratios.append(result["steps"] * floor_ms / 1e3 / cores)
            cluster_ms = 1e3 * result["cluster_cores"] / max(result["steps"], 1e-9)
            print(
                f"round {i + 1}: floor {floor_ms:.3f} ms per agent step (at most "
                f"{cores * 1e3 / floor_ms:,.0f}/s); cluster {bench_scaling.name(result)} "
                f"{result['steps']:,.0f} agent steps/s on {result['cluster_cores']:.2f} cores "
                f"({cluster_ms:.3f} ms CPU per agent step): {ratios[-1]:.2f} of the floor",
                flush=True,
            )
            print(breakdown(rows, result, cores), flush=True)
    return (
        f"cluster/floor: {statistics.median(ratios):.2f} (median of {len(ratios)} rounds, "
        f"{min(ratios):.2f}-{max(ratios):.2f}; cluster agent steps/s over cores / floor, "
        f"{bench_scaling.name(result)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default=str(report.REPO / "configs" / "pong_impala_2core.yaml"))
    parser.add_argument("--set", action="append", default=[], help="config override")
    parser.add_argument("--num-envs", type=int, default=None, help="default: env.num_envs")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per piece")
    parser.add_argument(
        "--against-cluster",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="rounds of the floor, then the config's own cluster (see the module's doc)",
    )
    parser.add_argument("--cluster-duration", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--piece", choices=list(PIECES), help=argparse.SUPPRESS)  # a child's
    args = report.parse_args(parser, tuned_malloc=False)
    args.cluster_warmup = 5.0
    cluster_overrides = list(args.set)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.duration, args.num_envs, args.against_cluster = 0.2, 2, 1
        args.cluster_duration, args.cluster_warmup = 1.0, 0.0
        cluster_overrides.append("env.num_envs=2")
    if args.piece:
        cpu, rate = run_piece(args.piece, args)
        print(f"piece {args.piece}: {cpu!r} {rate!r}")
        return
    if args.against_cluster < 0 or args.cluster_duration <= 0:
        parser.error("--against-cluster must be >= 0 and --cluster-duration > 0")
    if args.against_cluster:
        if args.write:
            parser.error("--write records the floor alone (without --against-cluster)")
        print(against_cluster(args, cluster_overrides))
        return
    procs.reexec_with_malloc_env()  # the pieces' processes inherit the launcher's settings
    started, load_before = time.monotonic(), report.load_average()

    from easyrl import config as config_lib
    from easyrl.cluster.launcher import thread_budgets

    cfg = config_lib.load(args.config, args.set)
    config_name = os.path.relpath(args.config, report.REPO)
    n = args.num_envs or cfg.env.num_envs
    threads = thread_budgets(cfg)
    (env_cpu, env_rate), (act_cpu, act_rate), (learn_cpu, learn_rate), (both_cpu, both_rate) = (
        piece_in_child(piece, args, threads[PIECES[piece]]) for piece in PIECES
    )
    params = cfg.algorithm.params
    per_worker = cfg.env.envs_per_worker
    per_worker_note = f" ({per_worker} per subprocess)" if per_worker > 1 else ""
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
        ["env+act", "alternating as in an actor; not in the floor", both_cpu * 1e3, both_rate],
    ]
    for piece, what, ms, rate in rows:
        print(f"{piece:>5} ({what}): {ms:.3f} ms CPU per agent step, {rate:,.0f} steps/s alone")
    interleaving = (
        f"interleaving: env+act {both_cpu * 1e3:.3f} ms per agent step, "
        f"{both_cpu / (env_cpu + act_cpu):.2f} x env + act alone"
    )
    print(interleaving)
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
            f"a process of its own for {args.duration:g} s, on its role's thread budget "
            f"(actor {threads['actor']}, learner {threads['learner']}) and the launcher's "
            "malloc settings, charged its process CPU time (all threads). "
            "The floor row's rate is cores / floor: no transport, replay or Python around the "
            "calls. The env+act row runs a vector step of the envs then the forward pass on "
            "its observations, alternating, in one process, as an actor does: the act piece "
            f"alone runs its forward passes back to back.\n\n`{interleaving}`\n\n`{last}`\n"
        )
        title = "Pong compute floor per agent step"
        report.write_section("pong-floor", report.section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
