"""Convergence runs (`pytest -m slow`): the real CLI trains until the target return."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cartpole_apex.yaml"


def _train(tmp_path: Path, *overrides: str) -> dict:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "easyrl.cli", "train", str(CONFIG)]
    for override in (f"run.dir={run_dir}", *overrides):
        command += ["--set", override]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return summary


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cartpole_apex_reaches_450(tmp_path):
    summary = _train(tmp_path)
    assert summary["reason"].startswith("target reached")
    assert summary["servers"]["ps/0"]["counters"]["return_mean"] >= 450


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cartpole_apex_two_of_each_reaches_450(tmp_path):
    summary = _train(tmp_path, "cluster.ps=2", "cluster.memory=2", "cluster.learner=2")
    assert summary["reason"].startswith("target reached")
    counters = summary["servers"]["ps/0"]["counters"]
    assert counters["learner/0/updates"] > 0 and counters["learner/1/updates"] > 0
    assert summary["servers"]["ps/1"]["counters"]["ps/1/applied"] > 0
