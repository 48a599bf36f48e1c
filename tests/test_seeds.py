"""What a seed promises: `run.deterministic` runs repeat exactly, and it is refused where
they cannot (real `easyrl train` launchers and role processes for the repeat)."""

import pytest
from test_cluster import ROOT, Run

from easyrl import config as config_lib
from easyrl.errors import ConfigError

PPO = ROOT / "configs" / "cartpole_ppo.yaml"


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ("cartpole_ppo.yaml", [], "needs cluster.actor: 1 .* got cluster.actor: 2"),
        (
            "cartpole_ppo.yaml",
            ["cluster.actor=1", "cluster.evaluator=1"],
            "needs cluster.evaluator: 0 .* got cluster.evaluator: 1",
        ),
        ("cartpole_apex.yaml", ["cluster.actor=1"], "dqn runs the async_replay flow"),
        ("cartpole_impala.yaml", ["cluster.actor=1"], "impala runs the async_replay flow"),
    ],
)
def test_deterministic_is_refused_where_timing_decides_the_run(config, overrides, message):
    overrides = ["run.deterministic=true", *overrides]
    with pytest.raises(ConfigError, match=f"^run.deterministic: {message}"):
        config_lib.load(ROOT / "configs" / config, overrides)
    cfg = config_lib.load(PPO, ["run.deterministic=true", "cluster.actor=1"])
    assert cfg.run.deterministic


def test_shard_zero_of_a_deterministic_run_queues_one_row_per_published_round():
    from easyrl.algorithms.optimizers import OptimizerSpec
    from easyrl.metrics import RunStats
    from easyrl.roles.ps import ParameterServer

    stats, spec = RunStats(), OptimizerSpec(kind="sgd", lr=0.1)
    ps = ParameterServer(0, spec, 10, None, stats, round_rows=True)
    assert ps.round_rows is not None
    stats.report("actor", 0, 512, 0, [20.0, 30.0], [20, 30], {"round": 0.0})
    stats.report("learner", 0, 0, 20, [], [], {"round": 1.0})
    ps.publish(1)
    ps.publish(1)  # published already: no second row
    stats.report("actor", 0, 512, 0, [40.0], [40], {"round": 1.0})  # after the row
    (clock, row), more = ps.round_rows.get_nowait(), ps.round_rows.qsize()
    assert more == 0 and clock >= 0.0
    assert row["env_steps"] == 512 and row["updates"] == 20 and row["return_mean"] == 25.0
    assert row["ps/0/round"] == 1 and row["learner/round"] == 1
    # Other shards, and runs that are not deterministic, write rows on a timer.
    assert ParameterServer(1, spec, 10, None, None, round_rows=True).round_rows is None
    assert ParameterServer(0, spec, 10, None, RunStats()).round_rows is None


def _rows(run: Run) -> list[dict]:
    """The run's metrics rows without what timing decides: the run clock, the rates and the
    Pull counts (how often the actor's long poll for the next round timed out)."""
    return [
        {k: v for k, v in row.items() if k != "time_s" and not k.endswith(("_per_s", "/pulls"))}
        for row in run.metrics()
    ]


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_two_deterministic_ppo_runs_write_the_same_metrics_rows(tmp_path):
    rows = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        run = Run(
            tmp_path / name,
            ["cluster.actor=1", "run.deterministic=true", "stop.max_env_steps=3000"],
            PPO,
            base=("stop.episode_return_mean=null", "stop.max_seconds=150"),
        )
        try:
            assert run.wait(180) == 0, run.output()
            rows.append(_rows(run))
        finally:
            run.cleanup()
    first, second = rows
    # One row per round of 8 envs x 64 steps; the sixth round passes 3,000 steps and stops.
    assert [r["env_steps"] for r in first] == [512.0 * (i + 1) for i in range(6)]
    assert (
        first[-1]["stop"]
        == "max_env_steps 3,000 reached at 3,072 (counters arrive in actor reports)"
    )
    assert first[-1]["updates"] == 6 * 20 and first[-1]["episodes"] > 0
    assert second == first
