"""Per-process thread budgets (easyrl.cluster.threads): the arithmetic over a host's cores and
the processes placed on it, the host's cores, the config keys, what the launcher hands its
children, and the TensorFlow pools a role process then runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from easyrl import config as config_lib
from easyrl.cluster import threads
from easyrl.cluster.launcher import LocalCluster
from easyrl.cluster.threads import THREADS_ENV, budgets, cgroup_cores, process_budget
from easyrl.config import ThreadsConfig
from easyrl.errors import ConfigError, EasyRLError

ROOT = Path(__file__).resolve().parent.parent


def counts(ps=1, memory=1, learner=1, actor=2, evaluator=0) -> dict[str, int]:
    return {"ps": ps, "memory": memory, "learner": learner, "actor": actor, "evaluator": evaluator}


@pytest.mark.parametrize(
    ("cores", "placed", "configured", "expected"),
    [
        # The 16-core Pong shapes: 8 actors, 2 memory shards.
        (16, counts(ps=2, memory=2, learner=4, actor=8), {}, dict(learner=1)),
        (16, counts(ps=1, memory=2, learner=2, actor=8), {}, dict(learner=2)),
        # One learner on a large host gets what the others leave.
        (32, counts(actor=4, evaluator=1), {}, dict(learner=25)),
        # Over-subscribed (the shipped 2-core Pong config): never below one thread.
        (2, counts(), {}, dict(learner=1)),
        # Configured values are kept, and count against the learners' share.
        (16, counts(actor=4), dict(actor=2), dict(actor=2, learner=6)),
        (16, counts(ps=2, learner=2), dict(ps=3, learner=8), dict(ps=3, learner=8)),
        (4, counts(), dict(memory=2, evaluator=3), dict(memory=2, evaluator=3, learner=1)),
    ],
)
def test_budgets_share_the_cores_the_others_leave_among_the_learners(
    cores, placed, configured, expected
):
    derived = {"ps": 1, "memory": 1, "actor": 1, "evaluator": 1}
    assert budgets(cores, placed, ThreadsConfig(**configured)) == {**derived, **expected}


def test_budgets_list_every_role_even_those_not_placed():
    got = budgets(8, {"ps": 1}, ThreadsConfig())
    assert list(got) == list(threads.ROLES)
    assert got["learner"] == 7  # a learner alone with the PS shard


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "max 100000\n"}, None),  # cgroup v2, no quota
        ({"cpu.max": "250000 100000\n"}, 2),  # 2.5 CPUs: 2 whole ones
        ({"cpu.max": "50000 100000\n"}, 1),  # half a CPU: still one thread
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
        ({}, None),  # nothing readable
    ],
)
def test_cgroup_cores_reads_the_cpu_quota(tmp_path, files, cores):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cores(tmp_path) == cores


@pytest.mark.cluster
def test_host_cores_follow_the_process_cpu_affinity():
    """A process pinned to one core counts one (a sweep's trials are pinned so)."""
    code = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from easyrl.cluster.threads import host_cores\n"
        "print(host_cores())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1"]


def test_a_process_budget_comes_from_the_placer_then_the_config_then_its_host(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    alone = threads.host_cores()
    assert process_budget("learner", ThreadsConfig()) == (alone, f"{alone} cores")
    assert process_budget("ps", ThreadsConfig()) == (1, f"{alone} cores")
    configured = ThreadsConfig(learner=5)
    assert process_budget("learner", configured) == (5, "cluster.threads.learner")
    monkeypatch.setenv(THREADS_ENV, "3")
    assert process_budget("learner", configured) == (3, THREADS_ENV)
    monkeypatch.setenv(THREADS_ENV, "zero")
    with pytest.raises(EasyRLError, match=f"{THREADS_ENV} must be a whole number >= 1"):
        process_budget("learner", configured)


def test_the_config_takes_per_role_threads_and_names_a_bad_key():
    raw = {"algorithm": {"name": "dqn"}}
    cfg = config_lib.from_dict(config_lib.apply_overrides(raw, ["cluster.threads.learner=4"]))
    assert cfg.cluster.threads == ThreadsConfig(learner=4)
    assert config_lib.from_dict(raw).cluster.threads == ThreadsConfig()  # 0: all derived
    bad = [
        ({"learner": -1}, "cluster.threads.learner must be >= 0, got -1"),
        ({"actor": "auto"}, "cluster.threads.actor: expected int, got str 'auto'"),
        ({"lerner": 2}, "unknown key 'cluster.threads.lerner'; did you mean "),
    ]
    for values, message in bad:
        with pytest.raises(ConfigError, match=message):
            config_lib.from_dict({**raw, "cluster": {"threads": values}})
    with pytest.raises(ConfigError, match="'actor.tf_threads' moved to 'cluster.threads.actor'"):
        config_lib.from_dict({**raw, "actor": {"tf_threads": 1}})


def test_the_launcher_hands_each_child_its_role_budget(tmp_path):
    raw = {
        "algorithm": {"name": "dqn"},
        "cluster": {"actor": 3, "threads": {"learner": 2, "ps": 2}},
        "run": {"dir": str(tmp_path)},
    }
    cluster = LocalCluster(config_lib.from_dict(raw), "token")
    placed = {"ps": 1, "memory": 1, "learner": 1, "actor": 3, "evaluator": 0}
    assert cluster.threads == budgets(threads.host_cores(), placed, ThreadsConfig(ps=2, learner=2))
    for role, expected in (("ps", "2"), ("memory", "1"), ("learner", "2"), ("actor", "1")):
        assert cluster._env(role)[THREADS_ENV] == expected, role
    cores = threads.host_cores()
    line = f"threads per process on {cores} cores: ps 2, memory 1, learner 2, actor 1"
    assert cluster.threads_line() == line  # `easyrl train` prints it


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("role", "placed", "pools"),
    [("learner", "3", (3, 3)), ("actor", None, (1, 2))],
)
def test_a_role_process_runs_tensorflow_on_its_budget(role, placed, pools):
    """A fresh process started as a role starts (TensorFlow imported first, the budget applied
    before any op): after an op, TensorFlow reports the budget's pools."""
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from easyrl.cli import import_tensorflow_quietly\n"
        "import_tensorflow_quietly()\n"
        "from easyrl import config\n"
        "from easyrl.roles.common import apply_thread_budget\n"
        f"apply_thread_budget({role!r}, config.from_dict({{'algorithm': {{'name': 'dqn'}}}}))\n"
        "import tensorflow as tf\n"
        "assert int(tf.constant(2) + 1) == 3\n"
        "t = tf.config.threading\n"
        "print(t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != THREADS_ENV}
    env |= {"TF_CPP_MIN_LOG_LEVEL": "2", **({THREADS_ENV: placed} if placed else {})}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(n) for n in pools]
    source = THREADS_ENV if placed else f"{threads.host_cores()} cores"
    assert f"thread budget {pools[0]} ({source}): TensorFlow intra-op {pools[0]}" in out.stderr
