"""How long `easyrl` takes to refuse a bad input: each case is a real `easyrl ...` command (the
console script of this Python, in a subprocess) that must fail with a clear message, and the
seconds until it exits. Everything these cases get wrong can be checked without TensorFlow,
so none of them should wait for its import (seconds of CPU).

Cases: a missing config file, invalid YAML, an unknown key, a wrong type, a value out of
range, an unknown env id, a missing extra (Box2D, else envpool), a new run in
a directory that holds a run, `--resume` of a directory that is no run, `--resume` refused
because its budget is spent, `rollout` / `export` / `plot` on a directory that is no run, and
`rollout --video` without moviepy (where it is not installed).
The run directory is a copy of `benchmarks/artifacts/pong_impala` (a real run's config and
checkpoints); nothing is written to it.

The table gives each case's seconds and CPU seconds (medians of `--repeat` runs), exit code
and the first line of its message; the last line is

    slowest error: S s

(goal: under 2 s on 2 cores; the load average is printed since the machine is shared).

    python benchmarks/bench_errors.py            # every case
    python benchmarks/bench_errors.py --smoke    # two cases, seconds
    python benchmarks/bench_errors.py --write    # and update benchmarks/RESULTS.md
"""

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by a test

from report import (  # noqa: E402
    REPO,
    load_average,
    markdown_table,
    section_text,
    write_section,
)

CONFIG = "configs/cartpole_ppo.yaml"
RUN = REPO / "benchmarks" / "artifacts" / "pong_impala"
"""A real run directory (config.yaml, checkpoints/ps-0.npz), copied before use."""
GOAL_S = 2.0
SMOKE_LINE = r"^slowest error: [\d.]+ s$"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


class Case(NamedTuple):
    """One bad input: its name, the `easyrl` arguments, and what its message must name (the
    key or the path at fault, and what to do where it says)."""

    name: str
    args: list[str]
    expect: tuple[str, ...]


class Outcome(NamedTuple):
    """What one case's command did: seconds to exit, CPU seconds, exit code, its stderr."""

    case: Case
    seconds: float
    cpu_s: float
    exit_code: int
    stderr: str

    @property
    def message(self) -> str:
        """The first line of the error message."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return next(
            (line for line in lines if line.startswith("easyrl: error:")), lines[0] if lines else ""
        )


def cases(work: Path) -> list[Case]:
    """Every bad input, with the files it needs created under `work` (run from the
    repository root: the configs are relative to it)."""
    bad_yaml = work / "bad.yaml"
    bad_yaml.write_text("algorithm:\n  name: ppo\n env: {id: CartPole-v1}\n")
    not_a_run, run, missing = work / "not_a_run", work / "run", work / "does_not_exist.yaml"
    not_a_run.mkdir()
    shutil.copytree(RUN, run)
    train = ["train", CONFIG, "--set"]
    found = [
        Case("config file missing", ["train", str(missing)], (str(missing), "cannot read")),
        Case("invalid YAML", ["train", str(bad_yaml)], (str(bad_yaml), "line 3, column 2")),
        Case("unknown key", [*train, "stop.max_secnds=3"], ("did you mean 'stop.max_seconds'",)),
        Case("wrong type", [*train, "stop.max_seconds=soon"], ("stop.max_seconds: expected",)),
        Case("out of range", [*train, "algorithm.clip=-1"], ("algorithm.clip must be > 0",)),
        Case("unknown env id", [*train, "env.id=CartPole-v9"], ("did you mean 'CartPole-v1'",)),
        missing_extra(),
        Case("used run.dir", [*train, f"run.dir={run}"], ("run.dir", str(run), "--resume")),
        Case("--resume no run", ["train", "--resume", str(not_a_run)], (str(not_a_run),)),
        Case(
            "--resume budget spent",
            ["train", "--resume", str(run), "--set", "stop.max_seconds=10"],
            ("past stop.max_seconds=10", "raise it"),
        ),
        Case("rollout no run", ["rollout", str(not_a_run)], (str(not_a_run), "no config.yaml")),
        Case(
            "export no run",
            ["export", str(not_a_run), "--out", str(work / "export")],
            (str(not_a_run), "no config.yaml"),
        ),
        Case(
            "plot no run",
            ["plot", str(not_a_run), "--out", str(work / "c.png")],
            (str(not_a_run), "no metrics.jsonl"),
        ),
    ]
    if importlib.util.find_spec("moviepy") is None:
        video = ["rollout", str(run), "--video", str(work / "videos")]
        found.append(Case("rollout --video, no moviepy", video, ("pip install moviepy",)))
    return [case for case in found if case is not None]


def missing_extra() -> Case | None:
    """An env that needs a package this machine lacks: Box2D (LunarLander), else envpool;
    None when both are installed."""
    if importlib.util.find_spec("Box2D") is None:
        args = ["train", "configs/lunarlander_sac.yaml"]
        return Case("missing extra (Box2D)", args, ("env.id", "Box2D is not installed"))
    if importlib.util.find_spec("envpool") is None:
        args = ["train", CONFIG, "--set", "env.vector=envpool"]
        return Case("missing extra (envpool)", args, ("env.vector", "pip install"))
    return None


def easyrl_command() -> list[str]:
    """The `easyrl` console script of this Python (not a shim in front of it), else
    `python -m easyrl.cli` (the same `main`)."""
    script = Path(sys.executable).parent / "easyrl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "easyrl.cli"]


def run_case(case: Case, command: list[str], repeat: int = 1) -> Outcome:
    """Runs one case `repeat` times from the repository root; its seconds are the median
    wall-clock time to exit and the median CPU time (user + system) the command used (the
    machine is shared: wall time wanders with the load, CPU time much less)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    seconds, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(
            [*command, *case.args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        seconds.append(time.monotonic() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    median = statistics.median
    return Outcome(case, median(seconds), median(cpu), done.returncode, done.stderr)


def failures(outcome: Outcome) -> list[str]:
    """What is wrong with an outcome: not exit code 2 (a refused input), a message that
    does not name what it must, a traceback."""
    problems = [] if outcome.exit_code == 2 else [f"exit code {outcome.exit_code}"]
    problems += [f"no {text!r}" for text in outcome.case.expect if text not in outcome.stderr]
    return problems + (["a traceback"] if "Traceback" in outcome.stderr else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two cases once each (seconds)")
    parser.add_argument(
        "--repeat", type=int, default=3, metavar="N", help="runs per case; the median counts"
    )
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    started, load_before = time.monotonic(), load_average()
    command = easyrl_command()
    with tempfile.TemporaryDirectory(prefix="bench_errors_") as tmp:
        selected = cases(Path(tmp))
        if args.smoke:
            selected = [c for c in selected if c.name in ("config file missing", "unknown key")]
        repeat = 1 if args.smoke else max(1, args.repeat)
        outcomes = [run_case(case, command, repeat) for case in selected]
    rows = [
        (
            o.case.name,
            f"{o.seconds:.2f}",
            f"{o.cpu_s:.2f}",
            o.exit_code,
            _cell(o.message.replace(tmp, "TMP")),
        )
        for o in outcomes
    ]
    headers = ["case", "seconds", "CPU s", "exit code", "message (first line)"]
    table = markdown_table(headers, rows)
    slowest = max(o.seconds for o in outcomes)
    print(table)
    bad = {o.case.name: failures(o) for o in outcomes if failures(o)}
    for name, problems in bad.items():
        print(f"FAILED {name}: {'; '.join(problems)}")
    load = f"load average (1 min) before / after: {load_before} / {load_average()}"
    print(load)
    if args.write and not args.smoke:
        body = (
            f"Each case is `{' '.join(Path(c).name for c in command)} ...` in a subprocess, run "
            f"from the repository root (TMP: a temporary directory); goal: every case under "
            f"{GOAL_S:g} s on 2 cores. CPU s is the command's own user + system time: what it "
            "costs on an idle machine, give or take; under a high load average the wall time "
            f"is a multiple of it.\n\n{table}\n\nslowest error: {slowest:.2f} s "
            f"(slowest CPU time {max(o.cpu_s for o in outcomes):.2f} s)\n"
        )
        title = "Errors: seconds until easyrl refuses a bad input"
        write_section("errors", section_text(title, started, load_before, body))
    print(f"slowest error: {slowest:.2f} s")
    return 1 if bad else 0


def _cell(text: str, width: int = 140) -> str:
    """`text` as a markdown table cell: pipes escaped, cut at `width` characters."""
    text = text.replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
