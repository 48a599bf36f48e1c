"""The chaos soak of issue 17 (`benchmarks/chaos_soak.py`), marked slow: about 6 minutes a
run. Run with `python -m pytest -m slow tests/test_chaos.py`."""

import json
from pathlib import Path

import benchmark_scripts
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cluster


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", ["cartpole_apex.yaml", "cartpole_ppo.yaml"])
def test_a_run_reaches_its_target_while_a_random_role_is_killed_every_15_s(tmp_path, config):
    run_dir = tmp_path / "run"
    soak = benchmark_scripts.load("chaos_soak")
    code = soak.main([str(ROOT / "configs" / config), "--dir", str(run_dir)])
    result = json.loads((run_dir / "chaos.json").read_text())
    assert code == 0, result["checks"]
    assert len(result["kills"]) >= 19, result["kills"]  # one every 15 s for 5 minutes
    killed = {k["process"].split("-")[0] for k in result["kills"]}
    assert killed == {"actor", "evaluator", "learner", "memory", "ps"}, result["kills"]
    if "inserts" in result:  # a replay table: every acknowledged insert stored or lost
        inserts = result["inserts"]
        assert inserts["memory_kills"] >= 1, result["kills"]
        assert inserts["acknowledged"] == inserts["stored"] + inserts["lost_to_memory_kills"]
