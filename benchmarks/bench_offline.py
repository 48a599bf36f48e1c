"""Offline training end to end: record a CartPole dataset with PPO, then train BC and MARWIL
(and BCQ when configs/cartpole_bcq.yaml exists) from it to their evaluation target.

Every step is the real CLI in a subprocess (`easyrl train CONFIG`, start-up included), in its
own run directory under a temporary folder:

1. `configs/cartpole_record.yaml --set output.dir=DATA`: PPO trains; its actors record
   whole episodes once their trailing mean return reaches 400 and the run stops after
   50,000 recorded steps (exit 0).
2. `configs/cartpole_bc.yaml`, `configs/cartpole_marwil.yaml` (`cartpole_bcq.yaml`) with
   `--set input.dir=DATA`: 0 actors; each stops (exit 0) at its evaluation target
   (`stop.eval_return_mean`: 350 for BC and MARWIL).

Reports the dataset (steps, episodes, the behaviour policy's mean episode return in it) and
per offline run the wall time, exit code, stop reason, evaluation return, the off-policy
estimates of the last evaluation and the learner updates.

    python benchmarks/bench_offline.py --write
    python benchmarks/bench_offline.py --data data/cartpole --skip-record   # reuse a dataset
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solve import solve_once  # noqa: E402
from report import (  # noqa: E402
    REPO,
    load_average,
    markdown_table,
    parse_args,
    section_text,
    write_section,
)

from easyrl import config as config_lib  # noqa: E402
from easyrl.offline.dataset import episode_bounds, read_steps  # noqa: E402

OFFLINE_CONFIGS = ("cartpole_bc.yaml", "cartpole_marwil.yaml", "cartpole_bcq.yaml")
"""The offline configs run on the dataset, in order (those that exist)."""
SMOKE_RECORD = (
    "output.min_return_mean=null",
    "output.max_steps=400",
    "env.num_envs=2",
    "cluster.actor=1",
    "run.log_interval_s=0.5",
)
"""`--smoke`: record from the first step, 400 steps, one actor; the stop is seen within
0.5 s (PS shard 0 checks it with each metrics row)."""
SMOKE_TRAIN = (
    "stop.eval_return_mean=9",
    "eval.interval_s=0.5",
    "eval.episodes=2",
    "replay.min_size_to_sample=256",
    "stop.max_seconds=60",
    "run.log_interval_s=0.5",
)
"""`--smoke`: BC alone, to a target any policy reaches (CartPole episodes last >= 8 steps),
evaluated on 2 episodes every 0.5 s, sampling from 256 steps (one batch) held."""
SMOKE_LINE = r"^Dataset: [\d,]+ steps in [\d,]+ whole episodes"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def train_once(config: Path, overrides: list[str], run_dir: Path) -> dict:
    """`solve_once` plus the evaluation and off-policy numbers of the final status."""
    result = solve_once(str(config), overrides, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    counters = summary["servers"].get("ps/0", {}).get("counters", {})
    for key in ("eval_return_mean", "evaluator/eval_ope_is", "evaluator/eval_ope_wis"):
        result[key.removeprefix("evaluator/")] = counters.get(key, float("nan"))
    return result


def describe_dataset(directory: Path) -> dict:
    """Steps, episodes and the mean episode return of a dataset."""
    steps = read_steps(directory)
    bounds = episode_bounds(steps)
    returns = np.add.reduceat(steps["reward"], bounds[:-1]) if len(bounds) > 1 else []
    return {
        "steps": len(steps["t"]),
        "episodes": len(bounds) - 1,
        "return_mean": float(np.mean(returns)) if len(returns) else float("nan"),
        "return_min": float(np.min(returns)) if len(returns) else float("nan"),
        "behaviour_logp": "action_logp" in steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, help="dataset directory (default: a temporary one)")
    parser.add_argument("--skip-record", action="store_true", help="use --data as it is")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parse_args(parser, tuned_malloc=False)
    smoke_train = SMOKE_TRAIN if args.smoke else ()
    if args.skip_record and args.data is None:
        parser.error("--skip-record needs --data")
    started, load_before = time.monotonic(), load_average()
    configs = REPO / "configs"
    rows, record = [], None
    with tempfile.TemporaryDirectory(prefix="easyrl-offline-") as tmp:
        data = (args.data or Path(tmp) / "data").resolve()
        if not args.skip_record:
            record = solve_once(
                str(configs / "cartpole_record.yaml"),
                [f"output.dir={data}", *(SMOKE_RECORD if args.smoke else ())],
                Path(tmp) / "rec",
            )
            print(json.dumps(record), flush=True)
        dataset = describe_dataset(data)
        print(json.dumps(dataset), flush=True)
        for name in OFFLINE_CONFIGS[:1] if args.smoke else OFFLINE_CONFIGS:
            if not (configs / name).exists():
                continue
            overrides = [f"input.dir={data}", *smoke_train, *args.overrides]
            result = train_once(configs / name, overrides, Path(tmp) / Path(name).stem)
            print(json.dumps(result), flush=True)
            target = config_lib.load(configs / name, overrides).stop.eval_return_mean
            rows.append([name, target, result["wall_s"], result["exit"]])
            rows[-1].append(result["eval_return_mean"])
            rows[-1] += [result["eval_ope_is"], result["eval_ope_wis"], result["updates"]]
            rows[-1].append(result["reason"])
    body = ""
    if record is not None:
        body += (
            f"Recording (`easyrl train configs/cartpole_record.yaml`): {record['wall_s']:.0f} s, "
            f"exit {record['exit']}, {record['reason']}; PPO's trailing mean return at the "
            f"stop {record['return_mean']:.1f}.\n\n"
        )
    body += (
        f"Dataset: {dataset['steps']:,} steps in {dataset['episodes']:,} whole episodes; mean "
        f"episode return {dataset['return_mean']:.1f} (min {dataset['return_min']:.0f}); "
        f"behaviour log-probabilities: {'yes' if dataset['behaviour_logp'] else 'no'}.\n\n"
    )
    headers = ["config", "target", "wall s", "exit", "eval return", "OPE IS", "OPE WIS"]
    body += markdown_table([*headers, "updates", "stop reason"], rows) + "\n\n"
    body += (
        "Each offline run: `easyrl train configs/<config> --set input.dir=<dataset>` (0 actors; "
        "target: the config's `stop.eval_return_mean`, 10 greedy episodes per evaluation; "
        "BCQ is reported when its config exists). OPE (algorithms with `action_logp`): "
        "trajectory-wise importance sampling of the learned stochastic policy on 100 logged "
        "episodes, undiscounted (IS weights over 400-500-step episodes are extreme: WIS is "
        "the readable one).\n"
    )
    print(body)
    if args.write:
        title = "Offline: record CartPole with PPO, then BC / MARWIL (/ BCQ) from the dataset"
        write_section("offline cartpole", section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
