"""Scaling: throughput of a whole Ape-X cluster as actors and memory shards are added.

Each point is a real cluster of the local launcher (`easyrl.cluster.launcher.LocalCluster`,
the code `easyrl train` runs: every role an `easyrl run --role R --task I` process) for
`--config` (default configs/cartpole_apex.yaml: Ape-X DQN, prioritized replay, rate
limiter at 16 samples per insert), with the stop condition removed and `cluster.actor` /
`cluster.memory` set per point: actors 1, 2, 4, 8 with one memory shard, then memory
shards 1, 2, 4 with `--memory-actors` (8) actors. After start-up the benchmark waits for
the learner's first update plus `--warmup` seconds, then measures `--duration` seconds:

- env steps/s and learner updates/s from PS shard 0's counters (what `metrics.jsonl`
  records; actors and the learner report to it every 0.5 s or so),
- inserts/s and samples/s from the memory shards' counters (summed over the shards),
- each process's CPU time (user + sys from /proc/PID/stat, its helper processes
  included) over the same window, grouped by role (the role comes from the process's
  `--role R --task I` command line): CPU cores used per role = CPU seconds / wall seconds.

From these it derives per-process capacity (env steps/s per actor core, inserts/s per
memory core, updates/s per learner core) and, from the fastest point, a projection for
N cores, labelled as such: the measured CPU cost of each role per env step, scaled
linearly.

    python benchmarks/bench_scaling.py --duration 30 --write
    python benchmarks/bench_scaling.py --actors 1,2 --memory 1 --duration 10   # quick check
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import common

from easyrl import config as config_lib
from easyrl.cluster.launcher import LocalCluster
from easyrl.errors import EasyRLError
from easyrl.transport import rpc

CPU_ROLES = ("actor", "memory", "learner", "ps", "evaluator", "bench")
POLL_S = 0.5
PROJECTION_CORES = (2, 4, 8, 16, 32)
NO_STOP = ["stop.episode_return_mean=null", "stop.eval_return_mean=null", "stop.max_seconds=null"]


def snapshot(cluster: LocalCluster) -> dict:
    """PS shard 0's counters, the memory shards' summed counters, CPU per process, time."""
    ps = cluster.status("ps", 0).get("counters", {})
    memory: dict[str, float] = {}
    for task in range(len(cluster.spec.memory)):
        for key, value in cluster.status("memory", task).get("counters", {}).items():
            name = key.split("/", 2)[-1]
            memory[name] = memory.get(name, 0.0) + value
    return {"time": time.monotonic(), "ps": ps, "memory": memory, "cpu": common.cpu_by_process()}


def wait(cluster: LocalCluster, seconds: float, until=None) -> None:
    """Sleeps `seconds` (or until `until()` is true), restarting crashed processes as the
    launcher does; raises when the launcher would give up."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        failure = cluster.check_children()
        if failure:
            raise EasyRLError(failure)
        if until is not None and until():
            return
        time.sleep(POLL_S)
    if until is not None:
        raise EasyRLError(f"not ready after {seconds:.0f} s")


def measure_point(args, actors: int, memory: int, run_dir: Path) -> dict:
    """Runs one cluster; returns rates and CPU cores per role over the measured window."""
    overrides = [
        f"cluster.actor={actors}",
        f"cluster.memory={memory}",
        *NO_STOP,
        f"run.dir={run_dir}",
        *args.overrides,
    ]
    cluster = LocalCluster(config_lib.load(args.config_path, overrides), rpc.new_token())
    started = time.monotonic()
    try:
        cluster.start()
        wait(
            cluster,
            common.READY_TIMEOUT_S,
            until=lambda: cluster.status("ps", 0).get("counters", {}).get("updates", 0) > 0,
        )
        first_update_s = time.monotonic() - started
        wait(cluster, args.warmup)
        before = snapshot(cluster)
        restarts = sum(c.restarts for c in cluster.children)
        wait(cluster, args.duration)
        after = snapshot(cluster)
        restarts = sum(c.restarts for c in cluster.children) - restarts
    finally:
        cluster.shutdown(workers_stopping=False)
    seconds = after["time"] - before["time"]

    def rate(source: str, key: str) -> float:
        return (after[source].get(key, 0.0) - before[source].get(key, 0.0)) / seconds

    per_process = common.cores_used(before["cpu"], after["cpu"], seconds)
    cores = {role: 0.0 for role in CPU_ROLES}
    for label, used in per_process.items():
        role = label.rsplit("-", 1)[0] if label != "bench" else label
        cores[role] = cores.get(role, 0.0) + used
    return {
        "actors": actors,
        "memory": memory,
        "seconds": seconds,
        "first_update_s": first_update_s,
        "restarts": restarts,
        "env_steps": rate("ps", "env_steps"),
        "updates": rate("ps", "updates"),
        "inserts": rate("memory", "inserts"),
        "samples": rate("memory", "samples"),
        "rate_limited": after["memory"].get("rate_limited_insert", 0.0)
        - before["memory"].get("rate_limited_insert", 0.0),
        "cores": cores,
        "per_process": per_process,
    }


def points(args) -> list[tuple[int, int]]:
    """(actors, memory shards) of every run: the actor sweep, then the memory sweep."""
    out = [(a, 1) for a in args.actors]
    out += [(args.memory_actors, m) for m in args.memory]
    return list(dict.fromkeys(out))  # the shared point (memory 1) once


def per_core(value: float, cores: float) -> float:
    return value / cores if cores > 0.01 else float("nan")


def projection(best: dict) -> str:
    """Projected env steps/s for N cores from the CPU cost per env step of each role."""
    steps = best["env_steps"]
    workers = ("actor", "memory", "learner", "ps", "evaluator")
    cost = {role: best["cores"].get(role, 0.0) / steps for role in workers}  # cores per step/s
    total = sum(cost.values())
    rows = []
    for n in PROJECTION_CORES:
        projected = n / total
        rows.append(
            [
                n,
                projected,
                projected * cost["actor"],
                projected * cost["memory"],
                projected * cost["learner"],
                projected * cost["ps"],
            ]
        )
    table = common.markdown_table(
        [
            "cores",
            "projected env steps/s",
            "actor cores",
            "memory cores",
            "learner cores",
            "PS cores",
        ],
        rows,
    )
    one_learner = 1.0 / cost["learner"] if cost["learner"] > 0 else float("nan")
    return (
        f"**Projection** (not measured): from the point with {best['actors']} actor(s) and "
        f"{best['memory']} memory shard(s), which used "
        + ", ".join(f"{best['cores'][r]:.2f} {r}" for r in workers if best["cores"].get(r))
        + f" cores for {steps:,.0f} env steps/s, i.e. {1000 * total:.3f} cores per 1,000 env "
        "steps/s. Assuming each role's CPU cost per env step stays as measured and processes "
        "are added in proportion (actors, memory shards, learners or PS shards), N cores "
        f"sustain N / {total:.2e} env steps/s:\n\n"
        + table
        + f"\n\nWith a single learner that can use at most one core, the learner caps the "
        f"cluster near {one_learner:,.0f} env steps/s (the rate limiter ties updates to "
        "inserts, so learner work grows with env steps); a multi-threaded TensorFlow learner "
        "on more cores, or more learners, moves that cap. The projection covers CPU only: a "
        "process below one core can still be the limit when it waits on round trips (the "
        "learner's sample, update, push and pull chain; an actor blocked by the rate limiter "
        "uses no CPU while it waits).\n"
    )


def report(results: list[dict], args) -> str:
    rows = []
    for r in results:
        c = r["cores"]
        rows.append(
            [
                f"{r['actors']} actor(s), {r['memory']} memory",
                r["env_steps"],
                r["inserts"],
                r["samples"],
                r["updates"],
                c["actor"],
                c["memory"],
                c["learner"],
                c["ps"],
                c["bench"],
                sum(c.values()),
                per_core(r["env_steps"], c["actor"]),
                per_core(r["inserts"], c["memory"]),
                per_core(r["updates"], c["learner"]),
                int(r["rate_limited"]),
            ]
        )
    table = common.markdown_table(
        [
            "cluster",
            "env steps/s",
            "inserts/s",
            "samples/s",
            "updates/s",
            "actor cores",
            "memory cores",
            "learner cores",
            "PS cores",
            "bench cores",
            "total cores",
            "env steps/s per actor core",
            "inserts/s per memory core",
            "updates/s per learner core",
            "inserts refused (limiter timeout)",
        ],
        rows,
    )
    busiest = [
        f"{r['actors']}a/{r['memory']}m: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["per_process"].items()))
        for r in results
    ]
    notes = [
        f"Config `{args.config}`"
        + "".join(f", `--set {o}`" for o in args.overrides)
        + f", stop condition removed; 1 PS shard, 1 learner. Each point measured for "
        f"{args.duration:g} s, starting {args.warmup:g} s after the learner's first update "
        "(start-up and TensorFlow imports excluded); first update after "
        + ", ".join(f"{r['first_update_s']:.0f}" for r in results)
        + " s; restarts during the windows: "
        + ", ".join(str(r["restarts"]) for r in results)
        + ".",
        f"Cores are CPU seconds / wall seconds on this {common.machine_info()['nproc']}-core "
        "machine; when the total reaches the core count, every role is squeezed and the "
        "per-core capacities are what one core of each role delivered under that contention. "
        "`bench cores` is the benchmark process polling Status.",
        "Per-process cores: " + "; ".join(busiest) + ".",
    ]
    best = max(results, key=lambda r: r["env_steps"])
    text = table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if best["env_steps"] > 0:
        text += "\n" + projection(best)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/cartpole_apex.yaml")
    parser.add_argument("--actors", default="1,2,4,8", help="actor counts (1 memory shard)")
    parser.add_argument("--memory", default="1,2,4", help="memory shard counts")
    parser.add_argument("--memory-actors", type=int, default=8, help="actors in the memory sweep")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the 1st update")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = common.parse_args(parser, tuned_malloc=False)
    try:
        args.actors = [int(x) for x in args.actors.split(",") if x]
        args.memory = [int(x) for x in args.memory.split(",") if x]
    except ValueError:
        parser.error("--actors and --memory take comma-separated integers")
    if min(args.actors + args.memory + [args.memory_actors]) < 1 or args.duration <= 0:
        parser.error("actor and memory counts must be >= 1 and --duration > 0")
    args.config_path = Path(args.config).resolve()
    if not args.config_path.is_file():
        parser.error(f"--config {args.config}: no such file")

    started, load_before = time.monotonic(), common.load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="easyrl-scaling-") as tmp:
        for actors, memory in points(args):
            print(f"{actors} actor(s), {memory} memory shard(s) ...", flush=True)
            result = measure_point(args, actors, memory, Path(tmp) / f"a{actors}-m{memory}")
            print(
                f"  env steps/s {result['env_steps']:,.0f}, inserts/s {result['inserts']:,.0f}, "
                f"updates/s {result['updates']:,.1f}, cores "
                + ", ".join(f"{k} {v:.2f}" for k, v in result["cores"].items()),
                flush=True,
            )
            results.append(result)
    text = report(results, args)
    print()
    print(text)
    if args.write:
        section = common.section_text(
            "Scaling: actors and memory shards", started, load_before, text
        )
        common.write_section("bench_scaling", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
