"""A learning result users can check: one config trained to its budget, beside the peers'
published figure for the same workload and budget.

Trains `easyrl train CONFIG` once (the real CLI in a subprocess, start-up included) in
`--run-dir` (resumable: a run that stopped early goes on with `--resume`), or reads a run
that already ended (`--report-only`), then:

- writes its learning curve as `benchmarks/curves/<name>.png` (`easyrl plot`) and `.csv`
  (env_steps, time_s, return_mean, eval_return_mean; one row per metrics line);
- with `--artifact`, copies what `easyrl rollout` and `easyrl.load` need into
  `benchmarks/artifacts/<name>/`: `config.yaml`, the PS checkpoints (`ps-*.npz`, the
  evaluator's `best.npz`) and `metrics.jsonl` (weights only: no replay, no logs);
- prints the row of the README's Results table: workload, budget, our return (the best
  evaluation, and the last training mean), the published figure, wall time, the curve.

`PUBLISHED` holds the peers' figures (sources in ../shared/NOTES.md); a config without an
entry prints "-" there.

    python benchmarks/bench_learning.py configs/lunarlander_sac.yaml --run-dir /tmp/ll \\
        --artifact lunarlander_sac --write
"""

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solve import SMOKE_OVERRIDES  # noqa: E402  (`--smoke`: CartPole PPO, bench_solve's)
from report import load_average, markdown_table, parse_args, section_text, write_section  # noqa: E402

HERE = Path(__file__).resolve().parent
SMOKE_LINE = r"^\| CartPole-v1 ppo \|"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""
PUBLISHED = {
    "lunarlander_sac": (
        "500k steps",
        "SB3 zoo SAC 260 +- 65 (v2, deterministic eval); TD3 207 at 300k",
    ),
    "pong_impala_2core": ("10M agent steps", "CleanRL PPO 20.4 (v4)"),
    "halfcheetah_sac": ("300k steps", "Tianshou SAC 9,059 +- 1,051 (10 seeds, v3); TD3 7,546"),
    "breakout_impala": ("40M frames", "RLlib IMPALA 385 (32 workers, v4); CleanRL PPO 415"),
    "spaceinvaders_impala": ("40M frames", "RLlib IMPALA 719 (32 workers, v4); SB3 zoo PPO 960"),
    "hopper_sac": ("300k steps", "Tianshou SAC 3,388 +- 115 (10 seeds, v3); TD3 1,583"),
}
"""Config stem -> (the peers' budget, their published figure)."""
HEADERS = ["workload", "budget", "easyrl", "published", "wall time (2 cores)", "curve"]


def train(config: str, run_dir: Path, overrides: list[str]) -> int:
    """Runs `easyrl train` (or `--resume` when `run_dir` holds a run); its exit code."""
    if (run_dir / "config.yaml").exists():
        command = [sys.executable, "-m", "easyrl.cli", "train", "--resume", str(run_dir)]
    else:
        command = [sys.executable, "-m", "easyrl.cli", "train", config]
        command += ["--set", f"run.dir={run_dir}"]
    for override in overrides:
        command += ["--set", override]
    return subprocess.run(command).returncode


def write_curve(run_dir: Path, png: Path) -> Path:
    """The run's curve as `png` and a CSV beside it; returns the CSV's path."""
    from easyrl.tools.plot import plot

    png.parent.mkdir(parents=True, exist_ok=True)
    plot([run_dir], png)
    path = png.with_suffix(".csv")
    keys = ["env_steps", "time_s", "return_mean", "eval_return_mean"]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(keys)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                writer.writerow([record.get(k, "") for k in keys])
    return path


def copy_artifact(run_dir: Path, target: Path) -> None:
    """What `easyrl rollout` and `easyrl.load` need of `run_dir`, into `target`."""
    (target / "checkpoints").mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "metrics.jsonl", "resumes.yaml"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, target / name)
    for path in sorted((run_dir / "checkpoints").glob("*.npz")):
        if path.name.startswith(("ps-", "best")):
            shutil.copy2(path, target / "checkpoints" / path.name)


def row(run_dir: Path, name: str, curve: str) -> list[str]:
    """The Results table's row of a finished run."""
    cfg_text = (run_dir / "config.yaml").read_text()
    import yaml

    cfg = yaml.safe_load(cfg_text)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    last = records[-1]
    best = last.get("eval_return_best")
    ours = f"train {last.get('return_mean', float('nan')):.1f}"
    if best is not None:
        ours = f"best eval {best:.1f}, " + ours
    ours += f" at {last.get('env_steps', 0):,.0f} env steps"
    budget, published = PUBLISHED.get(name, ("-", "-"))
    workload = f"{cfg['env']['id']} {cfg['algorithm']['name']}"
    return [workload, budget, ours, published, f"{last.get('time_s', 0):,.0f} s", curve]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("config", nargs="?", help="the config to train (--smoke: CartPole PPO)")
    parser.add_argument("--run-dir", type=Path, help="where the run lives (default: a new one)")
    parser.add_argument("--report-only", action="store_true", help="read --run-dir, no training")
    parser.add_argument("--artifact", metavar="NAME", help="copy it to benchmarks/artifacts/NAME")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parse_args(parser, tuned_malloc=False)
    curves = HERE / "curves"
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.config = args.config or "configs/cartpole_ppo.yaml"
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
        args.run_dir = args.run_dir or Path(f"/tmp/easyrl-learning-smoke-{time.time_ns()}")
        curves = args.run_dir / "curves"
    if args.config is None:
        parser.error("the config to train is required")
    if args.run_dir is None:
        args.run_dir = Path(f"runs/learning-{Path(args.config).stem}")
    started, load_before = time.monotonic(), load_average()
    if not args.report_only:
        code = train(args.config, args.run_dir, args.overrides)
        print(f"easyrl train exited {code}", flush=True)
    name = Path(args.config).stem
    png = curves / f"{name}.png"
    csv_path = write_curve(args.run_dir, png)
    print(f"wrote {png} and {csv_path}")
    if args.artifact:
        copy_artifact(args.run_dir, HERE / "artifacts" / args.artifact)
        print(f"copied the run's config, checkpoints and metrics to artifacts/{args.artifact}")
    link = f"[curve]({png.relative_to(HERE)})" if png.is_relative_to(HERE) else str(png)
    table = markdown_table(HEADERS, [row(args.run_dir, name, link)])
    print(table)
    if args.write:
        body = f"{table}\n\nRun directory: `{args.run_dir}`.\n"
        title = f"Learning: {Path(args.config).name} {' '.join(args.overrides)}".strip()
        write_section(f"learning {name}", section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
