"""`easyrl sweep`: the grid and its trials, the median stopping rule, and real sweeps of
`easyrl train` runs (a table, a plot, a re-run that skips what is finished and resumes what
was interrupted)."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl.errors import ConfigError
from easyrl.tools import sweep
from easyrl.tools.plot import Curves

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "configs" / "cartpole_ppo.yaml"


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


def _sweep(directory: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "easyrl.cli", "sweep", str(PPO), "--dir", str(directory)]
    command += ["--grid", "algorithm.lr=0.0003,0.001", "--seeds", "1", "--parallel", "1"]
    for override in ("stop.max_env_steps=2048", "stop.max_seconds=60", "cluster.actor=1"):
        command += ["--set", override]
    return subprocess.run(
        [*command, *extra], capture_output=True, text=True, timeout=timeout, cwd=directory.parent
    )


@pytest.mark.timeout(420)
def test_a_sweep_writes_its_table_and_plot_and_a_rerun_skips_or_resumes(tmp_path):
    directory = tmp_path / "sweep"
    first = _sweep(directory)
    assert first.returncode == 0, first.stdout + first.stderr
    with (directory / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == ["lr=0.0003,seed=0", "lr=0.001,seed=0"]
    assert [r["algorithm.lr"] for r in rows] == ["0.0003", "0.001"]
    for row in rows:
        # The budget (2,048 env steps) ends each trial before the target (450).
        assert row["status"] == "budget" and row["exit_code"] == "1", row
        assert float(row["env_steps"]) >= 2048 and row["final_return"] != "", row
        assert row["time_to_target_s"] == ""
        run_dir = directory / row["trial"]
        assert (run_dir / "summary.json").is_file() and (run_dir / "config.yaml").is_file()
    assert (directory / "sweep.png").stat().st_size > 0
    assert re.search(
        r"^lr=0\.001 +1 seed\(s\) +final return [\d.]+ \+- 0\.0 .*reached 450 in 0/1",
        first.stdout,
        re.M,
    ), first.stdout

    # Mark the second trial interrupted, as Ctrl-C leaves it: the re-run skips the first
    # and resumes the second from its checkpoints (its budget is spent: it stops at once).
    summary_path = directory / "lr=0.001,seed=0" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "exit_code": 130, "reason": "interrupted"}))
    second = _sweep(directory)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "lr=0.0003,seed=0: budget earlier; skipped" in second.stdout
    assert "lr=0.001,seed=0: started" in second.stdout
    assert (directory / "lr=0.001,seed=0" / "resumes.yaml").is_file()
    assert sweep.status(directory / "lr=0.001,seed=0") == "budget"

    # Another grid in the same directory is refused before anything runs.
    other = _sweep(directory, "--grid", "algorithm.clip=0.1")
    assert other.returncode == 2 and "holds another sweep" in other.stderr, other.stderr


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
