"""Peer comparison: easyrl vs Stable-Baselines3 vs RLlib on the same task, same machine,
one run of this harness.

Every contender runs in its own subprocess pinned to the same CPU cores (`--cores`), and
is measured the same way: wall-clock time from starting the process (imports and start-up
included) until the mean return of the last 100 episodes first reaches the target, the
env steps taken by then, and env steps per second over the whole run.

- easyrl: `easyrl train configs/<c>.yaml` (its `stop.episode_return_mean` = the target,
  window 100), every role a local process, the repository's configs as they are.
- Stable-Baselines3 (PyTorch): PPO and DQN with the tuned CartPole-v1 hyper-parameters of
  the RL Baselines3 Zoo (`hyperparams/ppo.yml`, `dqn.yml`), SB3's documented settings for
  this task.
- RLlib (PyTorch, new API stack): PPO, APPO and DQN with RLlib's own defaults
  (`PPOConfig()`, `APPOConfig()`, `DQNConfig()`), 1 env runner.

The peers are optional: install them into a separate virtual environment, never into
easyrl's (they pin other numpy/gymnasium/torch versions), and pass its Python:

    python -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install torch==2.13.0 stable-baselines3==2.9.2 "ray[rllib]==2.60.0"
    python benchmarks/bench_peers.py --peers-python /tmp/peers-venv/bin/python --write

A contender whose framework is missing is reported as "not installed", not skipped silently.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import (  # noqa: E402
    REPO,
    load_average,
    markdown_table,
    parse_args,
    section_text,
    write_section,
)

WINDOW = 100
"""Episodes in the trailing mean, for every contender (easyrl's `stop.window`)."""
SMOKE_TARGET = 15.0
"""`--smoke`: easyrl PPO alone (the peers need their own venv) to a mean any policy reaches."""
SMOKE_WINDOW = 10
"""`--smoke`: episodes in the trailing mean."""
SMOKE_OVERRIDES = ("cluster.actor=1", "run.log_interval_s=0.5")
"""`--smoke`: one actor; the target is seen within 0.5 s (PS shard 0 checks it per row)."""
SMOKE_LINE = r"^\| easyrl \| PPO \| [\d.]+ \|"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

PEERS = Path(__file__).resolve().parent / "peers"
"""The peers' runner scripts (run by the peers' own Python)."""


def pinned(command: list[str], cores: int) -> list[str]:
    """`command` restricted to CPUs 0..cores-1 (taskset)."""
    return ["taskset", "-c", f"0-{cores - 1}", *command]


def follow(command, target: float, window: int, budget_s: float, env=None, cwd=None) -> dict:
    """Runs a contender that prints JSON progress lines; stops it once the trailing mean of
    `window` episodes reaches `target` (or the budget runs out)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
    )
    last, solved_at, tail = {}, None, []
    assert proc.stdout is not None  # stdout=PIPE
    try:
        for line in proc.stdout:
            if time.monotonic() - start > budget_s:
                break
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                tail = (tail + [line.rstrip()])[-15:]
                continue
            last = record
            if record["episodes"] >= window and record["return_mean"] >= target:
                solved_at = time.monotonic() - start
                break
    finally:
        proc.kill()
        proc.wait()
    wall = time.monotonic() - start
    if not last and tail:
        print("\n".join(tail), file=sys.stderr)
    steps = last.get("steps", 0)
    return {
        "solved_s": solved_at,
        "steps": steps if solved_at else None,
        "steps_per_s": steps / wall if steps else None,
        "return_mean": last.get("return_mean"),
        "wall_s": wall,
    }


def easyrl_contender(
    config: str,
    target: float,
    window: int,
    budget_s: float,
    cores: int,
    tmp: Path,
    extra: tuple[str, ...],
):
    run_dir = tmp / Path(config).stem
    command = [sys.executable, "-m", "easyrl.cli", "train", str(REPO / config)]
    for override in (
        f"run.dir={run_dir}",
        f"stop.episode_return_mean={target}",
        f"stop.window={window}",
        f"stop.max_seconds={budget_s}",
        "stop.max_env_steps=null",
        *extra,
    ):
        command += ["--set", override]
    start = time.monotonic()
    proc = subprocess.run(pinned(command, cores), capture_output=True, text=True, cwd=tmp)
    wall = time.monotonic() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    counters = summary["servers"].get("ps/0", {}).get("counters", {})
    steps = int(counters.get("env_steps", 0))
    solved = proc.returncode == 0
    return {
        "solved_s": wall if solved else None,  # the launcher exits at the target
        "steps": steps if solved else None,
        "steps_per_s": steps / wall if steps else None,
        "return_mean": counters.get("return_mean"),
        "wall_s": wall,
    }


def has_module(python: str, module: str) -> bool:
    check = [python, "-c", f"import {module}"]
    return subprocess.run(check, capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers-python", default=sys.executable, help="Python of the peers")
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--budget-s", type=float, default=600.0, help="per contender")
    parser.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--only", default="", help="comma-separated contender names to run (default: all)"
    )
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.only, args.target, args.budget_s = "easyrl ppo", SMOKE_TARGET, 90.0
    started, load_before = time.monotonic(), load_average()
    contenders = [
        ("easyrl", "PPO", "configs/cartpole_ppo.yaml"),
        ("easyrl", "IMPALA", "configs/cartpole_impala.yaml"),
        ("easyrl", "Ape-X DQN", "configs/cartpole_apex.yaml"),
        ("Stable-Baselines3", "PPO", "PPO"),
        ("Stable-Baselines3", "DQN", "DQN"),
        ("RLlib", "PPO", "PPO"),
        ("RLlib", "APPO", "APPO"),
        ("RLlib", "DQN", "DQN"),
    ]
    only = {s.strip().lower() for s in args.only.split(",") if s.strip()}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)  # the peers' venv must not see easyrl's site packages
    modules = {"Stable-Baselines3": "stable_baselines3", "RLlib": "ray.rllib"}
    available: dict[str, bool] = {}  # asked only of the frameworks that run
    extra = SMOKE_OVERRIDES if args.smoke else ()
    window = SMOKE_WINDOW if args.smoke else WINDOW
    rows = []
    with tempfile.TemporaryDirectory(prefix="easyrl-peers-") as tmp:
        for framework, algo, what in contenders:
            label = f"{framework} {algo}"
            if only and label.lower() not in only and framework.lower() not in only:
                continue
            if framework == "easyrl":
                result = easyrl_contender(
                    what, args.target, window, args.budget_s, args.cores, Path(tmp), extra
                )
            elif not available.setdefault(
                framework, has_module(args.peers_python, modules[framework])
            ):
                rows.append([framework, algo, "not installed", None, None, None])
                continue
            else:
                script = (
                    "sb3_cartpole.py" if framework == "Stable-Baselines3" else "rllib_cartpole.py"
                )
                command = [args.peers_python, str(PEERS / script), what, "2000000"]
                command += [str(args.cores), str(window)]
                result = follow(
                    pinned(command, args.cores), args.target, window, args.budget_s, env, tmp
                )
            print(json.dumps({"contender": label, **result}), flush=True)
            solved = result["solved_s"]
            rows.append(
                [
                    framework,
                    algo,
                    f"{solved:.1f}" if solved else f"not reached ({result['wall_s']:.0f} s)",
                    result["steps"],
                    result["steps_per_s"],
                    result["return_mean"],
                ]
            )
    headers = [
        "framework",
        "algorithm",
        f"wall s to {args.target:g} (start-up incl.)",
        "env steps then",
        "env steps/s",
        "last mean return",
    ]
    body = (
        f"CartPole-v1, trailing mean of {window} episodes >= {args.target:g}; every "
        f"contender pinned to {args.cores} cores (taskset), one run each, run one after "
        "the other.\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        name = f"peers {args.only}".strip()  # a partial re-run gets its own section
        title = f"Peers: easyrl vs SB3 vs RLlib {args.only}".strip()
        write_section(name, section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
