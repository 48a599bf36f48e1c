"""Convergence runs (`pytest -m slow`): the real CLI trains each shipped config until its
target return; the run must exit 0 with "target reached". Timings are in
benchmarks/RESULTS.md (bench_solve.py), not asserted here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cluster

RUNS = {
    "apex": ("cartpole_apex.yaml", ()),
    "apex-two-of-each": (
        "cartpole_apex.yaml",
        ("cluster.ps=2", "cluster.memory=2", "cluster.learner=2"),
    ),
    "ppo": ("cartpole_ppo.yaml", ()),
    "pendulum-ppo": ("pendulum_ppo.yaml", ()),
    "es": ("cartpole_es.yaml", ()),
    "impala": ("cartpole_impala.yaml", ()),
    "impala-two-learners-two-memories": (
        "cartpole_impala.yaml",
        ("cluster.memory=2", "cluster.learner=2"),
    ),
    "a3c": ("cartpole_a3c.yaml", ()),
    "a2c": ("cartpole_a2c.yaml", ()),
    "pg": ("cartpole_pg.yaml", ()),
    "rainbow": ("cartpole_rainbow.yaml", ()),
    "impala-lstm-stateless": ("stateless_cartpole_impala_lstm.yaml", ()),
    "ppo-lstm-stateless": ("stateless_cartpole_ppo_lstm.yaml", ()),
    "r2d2-stateless": ("stateless_cartpole_r2d2.yaml", ()),
    "sac": ("pendulum_sac.yaml", ()),
    "td3": ("pendulum_td3.yaml", ()),
    "apex-ddpg": ("pendulum_apex_ddpg.yaml", ()),
}


@pytest.mark.slow
@pytest.mark.timeout(1300)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_config_reaches_its_target(tmp_path, name):
    config, overrides = RUNS[name]
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "easyrl.cli", "train", str(REPO / "configs" / config)]
    for override in (f"run.dir={run_dir}", *overrides):
        command += ["--set", override]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"].startswith("target reached"), summary["reason"]
    counters = summary["servers"]["ps/0"]["counters"]
    if "learner=2" in " ".join(overrides):
        assert counters["learner/0/updates"] > 0 and counters["learner/1/updates"] > 0
