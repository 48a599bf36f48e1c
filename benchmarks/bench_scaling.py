"""Scaling: throughput and CPU of a whole cluster as actors, memory shards, learners and PS
shards are added, for any config.

Each point is a real cluster of the local launcher (`easyrl.cluster.launcher.LocalCluster`,
the code `easyrl train` runs: every role an `easyrl run --role R --task I` process) for
`--config` (default configs/cartpole_apex.yaml; `configs/pong_impala_2core.yaml` for IMPALA
on Pong), its stop condition removed and `cluster.actor` / `cluster.memory` /
`cluster.learner` / `cluster.ps` set per point: every combination of the `--actors`,
`--memory`, `--learners` and `--ps` lists (an axis left out keeps the config's own count).
After start-up the benchmark waits for the learners' first update plus `--warmup` seconds,
then measures `--duration` seconds:

- agent (env) steps/s and learner updates/s from PS shard 0's counters (what
  `metrics.jsonl` records; actors and learners report to it every 0.5-2 s),
- inserts/s and samples/s from the memory shards' counters (summed over the shards),
- each process's CPU time (user + sys from /proc/PID/stat, its helper processes such as env
  subprocesses included) over the same window, grouped by role (from the process's
  `--role R --task I` command line): cores used = CPU seconds / wall seconds.

For each point it prints `cores per 1,000 agent steps/s` (the cluster's cores, the
benchmark's own polling left out) and the scaling efficiency against the linear projection
from the cheapest point (the one that used the fewest cores): agent steps/s of the point /
(agent steps/s per core of the cheapest point x cores of the point). A projection for N
cores from the fastest point's per-role CPU cost per agent step follows, labelled as such.

    python benchmarks/bench_scaling.py --duration 30 --write
    python benchmarks/bench_scaling.py --config configs/pong_impala_2core.yaml \\
        --actors 2 --learners 1,2 --duration 20
"""

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import procs
import servers
from report import (
    load_average,
    machine_info,
    markdown_table,
    parse_args,
    section_text,
    write_section,
)

from easyrl import config as config_lib
from easyrl.cluster.launcher import LocalCluster
from easyrl.errors import EasyRLError
from easyrl.transport import rpc

SMOKE_LINE = r"^cores per 1,000 agent steps/s: "
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""
WORKERS = ("actor", "memory", "learner", "ps", "evaluator")
"""The roles whose cores count as the cluster's (the benchmark's own process does not)."""
POLL_S = 0.5
PROJECTION_CORES = (2, 4, 8, 16, 32)
AXES = ("actor", "memory", "learner", "ps")
DEFAULT_CONFIG = "configs/cartpole_apex.yaml"


class Snapshot(NamedTuple):
    """PS shard 0's counters, the memory shards' summed counters, CPU per process, time."""

    time: float
    ps: dict[str, float]
    memory: dict[str, float]
    cpu: dict[int, tuple[str, float]]


def counters(cluster: LocalCluster, role: str, task: int) -> dict[str, float]:
    """A server's counters; raises when it does not answer."""
    status = cluster.status(role, task)
    if status is None:
        raise EasyRLError(f"{role}-{task} does not answer Status")
    return status.counters


def first_update(cluster: LocalCluster) -> bool:
    """Whether PS shard 0 counts an update; a Status that times out (a loaded machine, a
    shard still starting) is a no: a crash is `check_children`'s to find."""
    status = cluster.status("ps", 0)
    return status is not None and status.counters.get("updates", 0) > 0


def snapshot(cluster: LocalCluster) -> Snapshot:
    """The counters and CPU times of the cluster now."""
    memory: dict[str, float] = {}
    for task in range(len(cluster.spec.memory)):
        for key, value in counters(cluster, "memory", task).items():
            name = key.split("/", 2)[-1]
            memory[name] = memory.get(name, 0.0) + value
    ps = counters(cluster, "ps", 0)
    return Snapshot(time.monotonic(), ps, memory, procs.cpu_by_process())


def wait(cluster: LocalCluster, seconds: float, until=None) -> None:
    """Sleeps `seconds` (or until `until()` is true), restarting crashed processes as the
    launcher does; raises when the launcher would give up."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        failure = cluster.check_children(lambda line: print(f"  {line}", flush=True))
        if failure:
            raise EasyRLError(failure)
        if until is not None and until():
            return
        time.sleep(POLL_S)
    if until is not None:
        raise EasyRLError(f"no learner update after {seconds:.0f} s")


def measure_point(args, counts: dict[str, int], run_dir: Path) -> dict:
    """Runs one cluster; returns rates and CPU cores per role over the measured window."""
    overrides = [
        *(f"cluster.{role}={n}" for role, n in counts.items()),
        *servers.NO_STOP,
        f"run.dir={run_dir}",
        *args.overrides,
    ]
    cluster = LocalCluster(config_lib.load(args.config_path, overrides), rpc.new_token())
    started = time.monotonic()
    try:
        cluster.start()
        wait(
            cluster,
            servers.READY_TIMEOUT_S + args.warmup,
            until=lambda: first_update(cluster),
        )
        first_update_s = time.monotonic() - started
        wait(cluster, args.warmup)
        restarts = sum(c.restarts for c in cluster.children)
        before = snapshot(cluster)
        wait(cluster, args.duration)
        after = snapshot(cluster)
        restarts = sum(c.restarts for c in cluster.children) - restarts
    finally:
        cluster.shutdown(workers_stopping=False)
    seconds = after.time - before.time

    def rate(new: dict[str, float], old: dict[str, float], key: str) -> float:
        return (new.get(key, 0.0) - old.get(key, 0.0)) / seconds

    per_process = procs.cores_used(before.cpu, after.cpu, seconds)
    cores = procs.by_role(per_process)
    return {
        "counts": counts,
        "seconds": seconds,
        "first_update_s": first_update_s,
        "restarts": restarts,
        "steps": rate(after.ps, before.ps, "env_steps"),
        "updates": rate(after.ps, before.ps, "updates"),
        "inserts": rate(after.memory, before.memory, "inserts"),
        "samples": rate(after.memory, before.memory, "samples"),
        "cores": cores,
        "cluster_cores": sum(cores.get(r, 0.0) for r in WORKERS),
        "per_process": per_process,
    }


def name(result: dict) -> str:
    """ "2a/1m/1l/1ps": the point's process counts."""
    c = result["counts"]
    return f"{c['actor']}a/{c['memory']}m/{c['learner']}l/{c['ps']}ps"


def per_1000(result: dict) -> float:
    """Cluster cores per 1,000 agent steps/s."""
    return 1000 * result["cluster_cores"] / result["steps"] if result["steps"] else float("nan")


def add_efficiency(results: list[dict]) -> dict:
    """Sets each result's "linear" (agent steps/s the cheapest point's steps per core would
    give on its cores) and "efficiency" (measured / linear); returns the cheapest point."""
    cheapest = min(results, key=lambda r: r["cluster_cores"])
    per_core = cheapest["steps"] / max(cheapest["cluster_cores"], 1e-9)
    for r in results:
        r["linear"] = per_core * r["cluster_cores"]
        r["efficiency"] = r["steps"] / r["linear"] if r["linear"] else float("nan")
    return cheapest


def point_lines(result: dict) -> list[str]:
    """What is printed after each point: rates, per-role and per-process cores."""
    roles = ", ".join(f"{r} {v:.2f}" for r, v in result["cores"].items() if v >= 0.005)
    procs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(result["per_process"].items()))
    return [
        f"  agent steps/s {result['steps']:,.0f}, updates/s {result['updates']:,.1f}, "
        f"inserts/s {result['inserts']:,.0f}, samples/s {result['samples']:,.0f}",
        f"  cores per role: {roles} (cluster {result['cluster_cores']:.2f})",
        f"  cores per process: {procs}",
        f"  restarts in the window: {result['restarts']}",
    ]


def projection(best: dict) -> str:
    """Projected agent steps/s for N cores from the CPU cost per agent step of each role."""
    steps = best["steps"]
    cost = {role: best["cores"].get(role, 0.0) / steps for role in WORKERS}  # cores per step/s
    total = sum(cost.values())
    rows = [[n, n / total, *(n / total * cost[r] for r in AXES)] for n in PROJECTION_CORES]
    headers = ["cores", "projected agent steps/s", *(f"{r} cores" for r in AXES)]
    return (
        f"**Projection** (not measured): from point {name(best)}, which used "
        + ", ".join(f"{best['cores'][r]:.2f} {r}" for r in WORKERS if best["cores"].get(r))
        + f" cores for {steps:,.0f} agent steps/s ({1000 * total:.3f} cores per 1,000 agent "
        "steps/s). If each role's CPU cost per agent step stayed as measured and processes "
        f"were added in proportion, N cores would sustain N / {total:.2e} agent steps/s:\n\n"
        + markdown_table(headers, rows)
        + "\n\nCPU only: a process below one core can still be the limit when it waits on "
        "round trips (the learner's sample, step, push chain; an actor held back by "
        "back-pressure uses no CPU while it waits).\n"
    )


def report(results: list[dict], args) -> str:
    """The markdown table, notes and projection of all points."""
    cheapest = add_efficiency(results)
    rows = [
        [
            name(r),
            r["steps"],
            r["updates"],
            r["inserts"],
            r["samples"],
            *(r["cores"].get(role, 0.0) for role in AXES),
            r["cores"].get("bench", 0.0),
            r["cluster_cores"],
            per_1000(r),
            r["linear"],
            r["efficiency"],
        ]
        for r in results
    ]
    headers = ["cluster (actors/memory/learners/PS)", "agent steps/s", "updates/s"]
    headers += ["inserts/s", "samples/s", *(f"{r} cores" for r in AXES), "bench cores"]
    headers += ["cluster cores", "cores per 1,000 agent steps/s", "linear projection"]
    headers += ["efficiency"]
    notes = [
        f"Config `{args.config}`"
        + "".join(f", `--set {o}`" for o in args.overrides)
        + f", stop condition removed. Each point measured for {args.duration:g} s, starting "
        f"{args.warmup:g} s after the learners' first update (start-up excluded); first update "
        "after " + ", ".join(f"{r['first_update_s']:.0f}" for r in results) + " s; restarts "
        "in the windows: " + ", ".join(str(r["restarts"]) for r in results) + ".",
        f"Cores are CPU seconds / wall seconds on this {machine_info()['nproc']}-core "
        "machine (`bench cores`: the benchmark polling Status, not counted in the cluster's). "
        f"Linear projection: the cheapest point ({name(cheapest)}, "
        f"{cheapest['cluster_cores']:.2f} cores) scaled by cores; efficiency = measured / "
        "projection.",
        "Per-process cores: "
        + "; ".join(
            f"{name(r)}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["per_process"].items()))
            for r in results
        )
        + ".",
    ]
    text = markdown_table(headers, rows) + "\n\n"
    text += "\n".join(f"- {n}" for n in notes) + "\n"
    best = max(results, key=lambda r: r["steps"])
    if best["steps"] > 0:
        text += "\n" + projection(best)
    return text


def summary_lines(results: list[dict]) -> list[str]:
    """The closing lines: cores per 1,000 agent steps/s and efficiency of each point."""
    cheapest = add_efficiency(results)
    lines = []
    for r in results:
        lines.append(
            f"{name(r)}: {r['steps']:,.0f} agent steps/s on {r['cluster_cores']:.2f} cores, "
            f"efficiency {r['efficiency']:.2f} of linear from {name(cheapest)} "
            f"({r['linear']:,.0f} agent steps/s)"
        )
    best = max(results, key=lambda r: r["steps"])
    lines.append(f"cores per 1,000 agent steps/s: {per_1000(best):.3f} (at {name(best)})")
    return lines


def config_counts(cluster) -> dict[str, int]:
    """A config's own process counts per axis (`cluster` of a loaded config; a role it leaves
    at 0 counts 1, PS shards as they are)."""
    return {
        "actor": cluster.actor or 1,
        "memory": cluster.memory or 1,
        "learner": cluster.learner or 1,
        "ps": cluster.ps,
    }


def parse_counts(parser: argparse.ArgumentParser, text: str | None, default: int) -> list[int]:
    """A comma list of process counts >= 1 (`default` alone when not given)."""
    if text is None:
        return [default]
    try:
        counts = [int(x) for x in text.split(",") if x]
    except ValueError:
        parser.error(f"expected comma-separated integers, got {text!r}")
    if not counts or min(counts) < 1:
        parser.error(f"process counts must be >= 1, got {text!r}")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--actors", default="1,2,4", help="actor counts (comma list)")
    for axis, what in (("memory", "memory shard"), ("learners", "learner"), ("ps", "PS shard")):
        parser.add_argument(f"--{axis}", help=f"{what} counts (default: the config's)")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the 1st update")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:
        args.config, args.actors, args.duration, args.warmup = (
            DEFAULT_CONFIG,
            "1",
            1.0,
            0.0,
        )
        # The first update after 512 items (one batch) instead of the config's 1,000.
        args.overrides = ["env.num_envs=2", "replay.min_size_to_sample=512", *args.overrides]
    if args.duration <= 0 or args.warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    args.config_path = Path(args.config).resolve()
    if not args.config_path.is_file():
        parser.error(f"--config {args.config}: no such file")
    own = config_counts(config_lib.load(args.config_path, args.overrides).cluster)
    axes = [
        parse_counts(parser, args.actors, own["actor"]),
        parse_counts(parser, args.memory, own["memory"]),
        parse_counts(parser, args.learners, own["learner"]),
        parse_counts(parser, args.ps, own["ps"]),
    ]

    started, load_before = time.monotonic(), load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="easyrl-scaling-") as tmp:
        for combo in itertools.product(*axes):
            counts: dict[str, int] = dict(zip(AXES, combo, strict=True))
            print(
                ", ".join(f"{n} {role}" for role, n in counts.items()) + " ...",
                flush=True,
            )
            result = measure_point(args, counts, Path(tmp) / "-".join(map(str, combo)))
            print("\n".join(point_lines(result)), flush=True)
            results.append(result)
    text = report(results, args)
    print()
    print(text)
    print("\n".join(summary_lines(results)))
    if args.write:  # the default config's section, or one per other config
        stem = Path(args.config).stem
        own = "" if stem == Path(DEFAULT_CONFIG).stem else f"-{stem}"
        title = "Scaling: whole clusters" + (f", {Path(args.config).name}" if own else "")
        section = section_text(title, started, load_before, text)
        write_section("bench_scaling" + own, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
