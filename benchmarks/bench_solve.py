"""Time to solve: `easyrl train CONFIG` run end to end, N times, wall clock included.

Each run is the real CLI in a subprocess (start-up of every role process included),
its own run directory under a temporary folder. Reports per run the wall time, the
exit code, the stop reason, env steps, updates and PS shard 0's trailing mean return
when the run ended (the stop reason gives the mean the stop condition saw: the window
slides on as the last reports arrive), and the median wall time of the runs that reached
the target.

    python benchmarks/bench_solve.py configs/cartpole_apex.yaml --runs 3 --write
    python benchmarks/bench_solve.py configs/cartpole_apex.yaml --runs 1 \
        --set cluster.ps=2 --set cluster.memory=2 --set cluster.learner=2 --write
    python benchmarks/bench_solve.py configs/cartpole_ppo.yaml --runs 3 \
        --plot benchmarks/curves/cartpole_ppo.png --write

`--plot FILE` draws the learning curves of every run (`easyrl plot`) into FILE.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import (  # noqa: E402
    load_average,
    markdown_table,
    parse_args,
    section_text,
    write_section,
)

SMOKE_OVERRIDES = (
    "stop.episode_return_mean=15",
    "stop.window=10",
    "stop.max_env_steps=20000",
    "env.num_envs=2",
    "cluster.actor=1",
    "run.log_interval_s=0.5",
)
"""`--smoke`: one small run to a target any policy reaches (CartPole episodes last >= 8 steps:
it exits 0 once 10 episodes are done, seen within 0.5 s), 20,000 env steps at most."""
SMOKE_LINE = r"^Solved 1/1; median wall time: [\d.]+ s"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def solve_once(config: str, overrides: list[str], run_dir: Path) -> dict:
    """Runs `easyrl train` once; returns what its summary.json and clock say."""
    command = [sys.executable, "-m", "easyrl.cli", "train", config, "--set", f"run.dir={run_dir}"]
    for override in overrides:
        command += ["--set", override]
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    counters = summary["servers"].get("ps/0", {}).get("counters", {})
    return {
        "wall_s": wall,
        "exit": proc.returncode,
        "reason": (summary["reason"] or "").splitlines()[0],
        "env_steps": int(counters.get("env_steps", 0)),
        "updates": int(counters.get("updates", 0)),
        "return_mean": counters.get("return_mean", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("config", nargs="?", help="the config to train (--smoke: CartPole PPO)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--plot", metavar="FILE", help="learning curves of the runs (PNG)")
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.config, args.runs = args.config or "configs/cartpole_ppo.yaml", 1
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    if args.config is None:
        parser.error("the config to train is required")
    started, load_before = time.monotonic(), load_average()
    results = []
    with tempfile.TemporaryDirectory(prefix="easyrl-solve-") as tmp:
        for i in range(args.runs):
            result = solve_once(args.config, args.overrides, Path(tmp) / f"run{i}")
            print(json.dumps(result), flush=True)
            results.append(result)
        if args.plot:
            from easyrl.tools.plot import plot

            runs: list[str | Path] = [Path(tmp) / f"run{i}" for i in range(args.runs)]
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            print(f"wrote {plot(runs, args.plot)}")
    solved = [r["wall_s"] for r in results if r["exit"] == 0]
    rows = [
        [i, r["wall_s"], r["exit"], r["env_steps"], r["updates"], r["return_mean"], r["reason"]]
        for i, r in enumerate(results)
    ]
    table = markdown_table(
        ["run", "wall s", "exit", "env steps", "updates", "mean return at the end", "stop reason"],
        rows,
    )
    median = f"{statistics.median(solved):.1f} s" if solved else "no run reached the target"
    body = f"{table}\n\nSolved {len(solved)}/{len(results)}; median wall time: {median}.\n"
    if args.plot:
        image = Path(args.plot).resolve().relative_to(Path(__file__).resolve().parent)
        body += f"\nLearning curves of these runs: ![learning curves]({image})\n"
    print(body)
    if args.write:
        name = "solve " + " ".join([Path(args.config).stem, *args.overrides])
        title = f"Time to solve: {Path(args.config).name} {' '.join(args.overrides)}".strip()
        write_section(name, section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
