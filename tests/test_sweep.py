"""`easyrl sweep`: the grid and its trials, the median stopping rule, and real sweeps of
`easyrl train` runs (a table, a plot, a re-run that skips what is finished and resumes what
was interrupted)."""

import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cluster import _read_jsonl

from easyrl.errors import ConfigError
from easyrl.tools import sweep
from easyrl.tools.plot import Curves

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "configs" / "cartpole_ppo.yaml"
TARGET = 40  # the real sweep's mean return to reach: a random policy gets ~22 on CartPole


def test_the_grid_is_the_cross_product_of_values_and_seeds():
    grid = sweep.parse_grid(["algorithm.lr=0.0003, 0.001", "algorithm.clip=0.1,0.2"])
    assert grid == [("algorithm.lr", ["0.0003", "0.001"]), ("algorithm.clip", ["0.1", "0.2"])]
    trials = sweep.make_trials(grid, seeds=2)
    assert [t.name for t in trials][:3] == [
        "lr=0.0003,clip=0.1,seed=0",
        "lr=0.0003,clip=0.1,seed=1",
        "lr=0.0003,clip=0.2,seed=0",
    ]
    assert len(trials) == 8 and len({t.name for t in trials}) == 8
    assert trials[-1].overrides(Path("/s/x")) == [
        "algorithm.lr=0.001",
        "algorithm.clip=0.2",
        "run.seed=1",
        "run.dir=/s/x",
    ]
    assert trials[-1].label == "lr=0.001,clip=0.2"
    # Keys sharing their last component are named in full.
    same = sweep.make_trials(sweep.parse_grid(["model.hidden=[8]", "algorithm.hidden=1"]), 1)
    assert same[0].name == "model.hidden=_8_,algorithm.hidden=1,seed=0"


@pytest.mark.parametrize(
    ("items", "seeds", "message"),
    [
        ([], 1, "at least one --grid"),
        (["algorithm.lr"], 1, "expected KEY=V1,V2"),
        (["algorithm.lr="], 1, "expected KEY=V1,V2"),
        (["algorithm.lr=1", "algorithm.lr=2"], 1, "given twice"),
        (["algorithm.lr=1"], 0, "--seeds must be >= 1"),
    ],
)
def test_a_bad_grid_is_refused(items, seeds, message):
    with pytest.raises(ConfigError, match=message):
        sweep.make_trials(sweep.parse_grid(items), seeds)


def _curves(points: list[tuple[float, float]]) -> Curves:
    times, returns = [t for t, _ in points], [r for _, r in points]
    return Curves("x", times, times, returns, [], [], [])


def test_the_median_rule_stops_a_trial_behind_the_finished_ones():
    finished = [_curves([(10, 20), (40, 100)]), _curves([(10, 30), (40, 200)]), None]
    # At 40 s the finished trials had reached 100 and 200 (median 150).
    assert sweep.hopeless(_curves([(10, 50), (40, 90)]), finished, grace_s=30)
    assert not sweep.hopeless(_curves([(10, 50), (40, 160)]), finished, grace_s=30)
    # Not before the grace, nor against a single finished trial, nor without a return yet.
    assert not sweep.hopeless(_curves([(10, 1)]), finished, grace_s=30)
    assert not sweep.hopeless(_curves([(40, 1)]), finished[:1], grace_s=30)
    assert not sweep.hopeless(None, finished, grace_s=30)
    # At 20 s the finished ones had reached 20 and 30: judged against those, not their ends.
    assert not sweep.hopeless(_curves([(20, 26)]), finished, grace_s=10)


def test_the_cores_are_split_between_parallel_trials(monkeypatch):
    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert sweep._core_shares(2) == [[0, 1], [2, 3, 4]]
    assert sweep._core_shares(1) == [[0, 1, 2, 3, 4]]
    assert sweep._core_shares(7) == [[0], [1], [2], [3], [4], [0], [1]]


def _sweep_command(directory: Path, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "easyrl.cli", "sweep", str(PPO), "--dir", str(directory)]
    command += ["--grid", "algorithm.lr=0.0003,0.001", "--seeds", "1", "--parallel", "1"]
    # A target PPO reaches in seconds (the trials stop there, exit 0, "reached"); 20 s of
    # run clock is the budget of a trial that does not.
    sets = (f"stop.episode_return_mean={TARGET}", "stop.max_seconds=20", "cluster.actor=1")
    for override in sets:
        command += ["--set", override]
    return [*command, *extra]


def _sweep(directory: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _sweep_command(directory, *extra),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=directory.parent,
    )


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_an_interrupted_sweep_resumes_and_writes_its_table_and_plot(tmp_path):
    directory = tmp_path / "sweep"
    first_trial, second_trial = directory / "lr=0.0003,seed=0", directory / "lr=0.001,seed=0"
    # Ctrl-C once the first trial has trained a little: it checkpoints and stops.
    out = tmp_path / "first.out"
    with out.open("w") as f:
        first = subprocess.Popen(
            _sweep_command(directory), stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    deadline = time.monotonic() + 120
    while not any(r.get("env_steps", 0) > 0 for r in _read_jsonl(first_trial / "metrics.jsonl")):
        assert first.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    assert first.wait(60) == 130, out.read_text()
    assert sweep.status(first_trial) == "partial" and sweep.status(second_trial) == "new"

    # The same command again resumes the first trial and runs the second.
    second = _sweep(directory)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "lr=0.0003,seed=0: started" in second.stdout
    assert (first_trial / "resumes.yaml").is_file() and not (second_trial / "resumes.yaml").exists()
    with (directory / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == ["lr=0.0003,seed=0", "lr=0.001,seed=0"]
    assert [r["algorithm.lr"] for r in rows] == ["0.0003", "0.001"]
    for row in rows:  # the target (TARGET) or the budget (20 s)
        assert row["status"] in ("reached", "budget") and row["exit_code"] in ("0", "1"), row
        assert float(row["env_steps"]) > 0 and row["final_return"] != "", row
        assert (row["time_to_target_s"] != "") == (row["status"] == "reached"), row
    assert (directory / "sweep.png").stat().st_size > 0
    summary = r"^lr=0\.001 +1 seed\(s\) +final return [\d.]+ \+- 0\.0 .*reached 40 in [01]/1"
    assert re.search(summary, second.stdout, re.M), second.stdout

    # Once more: every trial is finished, nothing runs.
    third = _sweep(directory)
    assert third.returncode == 0 and third.stdout.count("earlier; skipped") == 2, third.stdout
    # Another grid in the same directory is refused before anything runs.
    other = _sweep(directory, "--grid", "algorithm.clip=0.1")
    assert other.returncode == 2 and "holds another sweep" in other.stderr, other.stderr


@pytest.mark.cluster
def test_a_bad_key_is_refused_before_any_trial_starts(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "easyrl.cli", "sweep", str(PPO), "--grid", "algorithm.lrr=1,2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "lrr" in done.stderr and "lr" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
