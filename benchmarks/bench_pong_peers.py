"""Pong throughput, easyrl vs Sample Factory 2 (APPO) and RLlib 2.60 (IMPALA), same cores, one
run of this harness.

Each contender trains Atari Pong from scratch for `--window` seconds, pinned to the same
cores (taskset), one after the other; measured the same way: env frames (agent steps x 4,
the frame skip) per second between its first progress report and the end of the window
(steady state, start-up excluded), frames/s over the whole window from process start, and
the mean episode return it reached by then.

- easyrl, `configs/pong_impala_2core.yaml` as shipped (42x42x4 frames, EasyRL's 4-layer
  conv net), and the same config at 84x84x4 with the Nature-DQN conv net Sample Factory
  uses (`84x84` row): the apples-to-apples row.
- Sample Factory 2.1.1 APPO (PyTorch), `sf_examples.atari.train_atari --env=atari_pong`
  with its Atari defaults (84x84x4, Nature conv net), sized for the cores: 2 workers of 8
  envs each, double-buffered (`worker_num_splits=2`), rollouts of 64 (so that one round
  is its 4 batches of 256), CPU device. Its frames count the
  frame skip (`summaries_use_frameskip`), as easyrl's do.

- RLlib 2.60 IMPALA (new API stack, PyTorch), `peers/rllib_pong.py`: RLlib's own Atari
  pipeline at 84x84x4, the Nature conv net, 2 env runners of 8 envs, the learner in the
  driver, CPU only, RLlib's defaults otherwise. Its frames are agent steps x 4 as well.

The peers are optional, each in its own virtual environment, never easyrl's (Sample Factory
needs gymnasium<1; both need torch):

    python -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install "torch==2.13.0+cpu" sample-factory==2.1.1 \\
        gymnasium==0.29.1 ale-py==0.9.1 "numpy<2"
    python -m venv /tmp/rllib-venv
    /tmp/rllib-venv/bin/pip install "torch==2.13.0+cpu" "ray[rllib]==2.60.0" ale-py \\
        opencv-python-headless
    python benchmarks/bench_pong_peers.py --peers-python /tmp/peers-venv/bin/python \\
        --rllib-python /tmp/rllib-venv/bin/python --write
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import REPO, load_average, markdown_table, parse_args, section_text, write_section  # noqa: E402

NATURE_84 = (
    "env.atari.screen_size=84",
    "model.conv=[[32,8,4],[64,4,2],[64,3,1]]",
    "model.padding=valid",
    "model.hidden=[512]",
)
"""easyrl at Sample Factory's Atari shape: 84x84x4 frames, the Nature-DQN conv net."""
SMOKE_WINDOW_S = 120.0
"""`--smoke`: the 42x42x4 easyrl row alone (the peers need their own venvs), smaller, until
1,000 agent steps (the window is only a bound), reporting every 0.25 s so that the steps
span several reports (a steady part)."""
SMOKE_OVERRIDES = (
    "env.num_envs=2",
    "cluster.actor=1",
    "run.log_interval_s=0.25",
    "stop.max_env_steps=1000",
)
SMOKE_LINE = r"^\| easyrl IMPALA, 42x42x4 \(pong_impala_2core.yaml\) \| [\d,]+ \|"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def pinned(command: list[str], cores: int) -> list[str]:
    return ["taskset", "-c", f"0-{cores - 1}", *command]


def easyrl(window: float, cores: int, extra: tuple[str, ...]) -> dict:
    """One easyrl run of `window` seconds: frames/s and the return reached."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = ["easyrl", "train", str(REPO / "configs" / "pong_impala_2core.yaml")]
        for override in (f"stop.max_seconds={window}", f"run.dir={run_dir}", *extra):
            command += ["--set", override]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        start = time.monotonic()
        subprocess.run(pinned(command, cores), env=env, stdout=subprocess.DEVNULL, check=False)
        wall = time.monotonic() - start
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    moving = [r for r in records if r.get("env_steps", 0) > 0]
    first, last = moving[0], moving[-1]
    frames = 4 * (last["env_steps"] - first["env_steps"])
    return {
        "steady": frames / (last["time_s"] - first["time_s"]),
        "whole": 4 * last["env_steps"] / wall,
        "frames": 4 * last["env_steps"],
        "return": last.get("return_mean"),
        "wall": wall,
    }


STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]"


def sample_factory(python: str, window: float, cores: int, *extra: str) -> dict:
    """One Sample Factory APPO run of `window` seconds (its own log parsed)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [python, str(REPO / "benchmarks" / "peers" / "sf_pong.py"), "--env=atari_pong"]
        command += [f"--train_dir={tmp}", "--experiment=pong", "--device=cpu"]
        command += ["--num_workers=2", "--num_envs_per_worker=8", "--worker_num_splits=2"]
        command += ["--rollout=64"]  # 2 x 8 x 64 = 1,024 samples: 4 batches of 256, as its default
        command += [f"--train_for_seconds={int(window)}", "--with_wandb=False"]
        command += ["--save_every_sec=100000", "--restart_behavior=overwrite", *extra]
        # Its own --train_for_seconds is not a hard stop (a 45 s run went on for minutes):
        # the window is enforced from outside (SIGINT, then SIGKILL 20 s later).
        limit = ["timeout", "-s", "INT", "-k", "20", str(int(window))]
        start = time.time()
        done = subprocess.run(limit + pinned(command, cores), capture_output=True, text=True)
    log = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # its colours
    reports = []
    for line in log.splitlines():
        stamp = re.search(STAMP, line)
        total = re.search(r"Total num frames: (\d+)", line)
        if stamp and total and int(total.group(1)) > 0:
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            reports.append((when, int(total.group(1))))
    if len(reports) < 2:
        raise RuntimeError(f"Sample Factory reported no progress:\n{log[-3000:]}")
    rewards = re.findall(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]", log)
    (t0, f0), (t1, f1) = reports[0], reports[-1]
    return {
        "steady": (f1 - f0) / (t1 - t0),
        "whole": f1 / (t1 - start),
        "frames": f1,
        "return": float(rewards[-1]) if rewards else None,
        "wall": t1 - start,
    }


def rllib(python: str, window: float, cores: int) -> dict:
    """One RLlib IMPALA run of `window` seconds (its JSON progress lines parsed)."""
    command = [python, str(REPO / "benchmarks" / "peers" / "rllib_pong.py"), "IMPALA"]
    start = time.monotonic()
    # It stops itself after its first training iteration past the window; the outer
    # limit only guards against a hang.
    done = subprocess.run(
        ["timeout", "-k", "20", str(int(window) + 300), *pinned([*command, str(window)], cores)],
        capture_output=True,
        text=True,
    )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    moving = [r for r in records if r["env_steps"] > 0]
    if len(moving) < 2:
        raise RuntimeError(f"RLlib reported no progress:\n{done.stderr[-3000:]}")
    first, last = moving[0], moving[-1]
    returns = [r["return_mean"] for r in records if r["return_mean"] is not None]
    return {
        "steady": 4 * (last["env_steps"] - first["env_steps"]) / (last["time_s"] - first["time_s"]),
        "whole": 4 * last["env_steps"] / last["time_s"],
        "frames": 4 * last["env_steps"],
        "return": returns[-1] if returns else None,
        "wall": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--peers-python", help="Python of the venv with sample-factory")
    parser.add_argument("--rllib-python", help="Python of the venv with ray[rllib]")
    parser.add_argument("--window", type=float, default=300.0, help="seconds each contender trains")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.window, args.peers_python, args.rllib_python = SMOKE_WINDOW_S, None, None
    started, load_before = time.monotonic(), load_average()
    rows = []
    smoke = SMOKE_OVERRIDES if args.smoke else ()
    contenders = [
        (
            "easyrl IMPALA, 42x42x4 (pong_impala_2core.yaml)",
            lambda: easyrl(args.window, args.cores, smoke),
        ),
        (
            "easyrl IMPALA, 84x84x4, Nature conv net",
            lambda: easyrl(args.window, args.cores, NATURE_84),
        ),
    ][: 1 if args.smoke else 2]
    if args.peers_python:
        python = args.peers_python
        contenders += [
            (
                "Sample Factory 2.1.1 APPO, 84x84x4, Nature conv net (its defaults: 4 epochs)",
                lambda: sample_factory(python, args.window, args.cores),
            ),
            (
                "Sample Factory 2.1.1 APPO, same, 1 epoch (one pass per sample, as IMPALA)",
                lambda: sample_factory(python, args.window, args.cores, "--num_epochs=1"),
            ),
        ]
    if args.rllib_python:
        rllib_python = args.rllib_python
        contenders.append(
            (
                "RLlib 2.60 IMPALA, 84x84x4, Nature conv net (its defaults otherwise)",
                lambda: rllib(rllib_python, args.window, args.cores),
            )
        )
    for name, run in contenders:
        result = run()
        print(name, result, flush=True)
        ret = "-" if result["return"] is None else f"{result['return']:.1f}"
        rows.append(
            (
                name,
                f"{result['steady']:,.0f}",
                f"{result['whole']:,.0f}",
                f"{result['frames']:,.0f}",
                ret,
            )
        )
    if not args.peers_python:
        rows.append(("Sample Factory 2.1.1 APPO", "not installed", "", "", ""))
    if not args.rllib_python:
        rows.append(("RLlib 2.60 IMPALA", "not installed", "", "", ""))
    table = markdown_table(
        ["contender", "frames/s (steady)", "frames/s (whole window)", "frames", "return reached"],
        rows,
    )
    body = (
        f"Each contender trained Pong from scratch for {args.window:.0f} s on cores "
        f"0-{args.cores - 1}, one after the other. Frames = agent steps x 4 (frame skip). "
        "Steady: between the first progress report and the end; whole window: from "
        "process start (imports included).\n\n" + table
    )
    title = "Pong throughput vs Sample Factory and RLlib (issue 16)"
    text = section_text(title, started, load_before, body)
    print(text)
    if args.write:
        write_section("pong-peers", text)


if __name__ == "__main__":
    main()
