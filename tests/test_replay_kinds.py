"""Replay kinds as objects (easyrl.replay.kinds): each registered once and read by the config
loader, the contract check, the memory role and k8s; a kind defined here, outside the
package, is registered, loaded from a config and served by a memory shard over real gRPC."""

import dataclasses
import os
from pathlib import Path

import docs_code
import grpc
import numpy as np
import pytest
from test_cluster import _counters, one_each

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.cluster import k8s
from easyrl.envs import env_spaces
from easyrl.errors import ConfigError, ReplayError, TransportError
from easyrl.replay import AggregateTable, LimitedTable, kinds
from easyrl.replay.kinds import Kind
from easyrl.roles import memory as memory_role
from easyrl.transport import rpc
from easyrl.transport.clients import MemoryClient

TOKEN = "kinds-test-token"


# --- a replay kind of our own: docs/architecture.md's ---------------------------------------

KIND_DIR = docs_code.importable("newest_kind.py")
"""Where docs/architecture.md's `newest_kind.py` is written (on sys.path; the fixtures put it
on the PYTHONPATH of the processes a run starts)."""
from newest_kind import NEWEST, Newest, build_newest  # noqa: E402

NEWEST_DQN = '''
"""DQN whose items go to the "newest" replay kind, which importing newest_kind registers (in
every process of a run: each one imports this module)."""
import dataclasses

import newest_kind  # noqa: F401
from easyrl.algorithms import dqn

SPEC = dataclasses.replace(dqn.SPEC, replay_kinds=("newest",), dataset_items=None)
'''


@pytest.fixture
def newest_dqn(tmp_path, monkeypatch) -> str:
    """The name of an algorithm module of user code that uses the "newest" kind, importable
    here and by the processes a run starts (as this test module is)."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "newest_dqn.py").write_text(NEWEST_DQN)
    (modules / "unknown_kind_dqn.py").write_text(NEWEST_DQN.replace('"newest"', '"newst"'))
    monkeypatch.syspath_prepend(str(modules))
    path = [str(modules), str(KIND_DIR), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    return "newest_dqn"


def newest_config(name: str, **replay) -> config_lib.Config:
    raw = {
        "algorithm": {"name": name, "batch_size": 4},
        "replay": {"capacity": 16, "min_size_to_sample": 3, **replay},
    }
    return config_lib.from_dict(raw)


def items(spec: dict, start: int, n: int) -> dict[str, np.ndarray]:
    """`n` items of `spec`; every value of item i is `start + i`."""
    k = np.arange(start, start + n)
    return {
        name: (k.reshape(-1, *[1] * len(shape)) + np.zeros(shape)).astype(dtype)
        for name, (shape, dtype) in spec.items()
    }


@pytest.fixture
def serve():
    """Serves a MemoryServer on 127.0.0.1; returns (client, memory) of the last one."""
    started = []

    def start(memory: memory_role.MemoryServer) -> MemoryClient:
        server, port = rpc.make_server("127.0.0.1:0", TOKEN, max_workers=4)
        rpc.add_servicer("memory", memory, server)
        server.start()
        started.append((memory, server))
        address = f"127.0.0.1:{port}"
        return MemoryClient(rpc.Client(rpc.stub_class("memory"), address, TOKEN, timeout_s=5.0))

    yield start
    for memory, server in started:
        memory.close()
        server.stop(None).wait()


def test_a_kind_defined_outside_the_package_is_loaded_built_and_served_over_grpc(newest_dqn, serve):
    cfg = newest_config(newest_dqn)
    assert cfg.replay.kind == "newest" and cfg.replay.kind_spec is NEWEST
    assert not cfg.replay.prioritized  # actors send no priorities, learners no updates
    spec = registry.replay_spec(cfg, *env_spaces("CartPole-v1"))
    memory = memory_role.build(cfg, spec, 0)
    assert isinstance(memory.table, LimitedTable) and isinstance(memory.table.table.sampler, Newest)
    client = serve(memory)

    client.insert(items(spec, 0, 2), actor=0)
    assert client.sample(2, timeout_s=0.2) is None  # min_size_to_sample 3: not yet
    client.insert(items(spec, 2, 8), actor=0)  # the shard now samples ahead: keys 6 to 9
    taken = client.sample(4, timeout_s=5.0)  # the prefetched batch size
    assert taken is not None
    np.testing.assert_array_equal(taken.keys, [6, 7, 8, 9])
    np.testing.assert_array_equal(taken.data["action"], [6, 7, 8, 9])
    np.testing.assert_array_equal(taken.weights, 1.0)
    taken = client.sample(2, timeout_s=5.0)  # not prefetched
    assert taken is not None
    np.testing.assert_array_equal(taken.keys, [8, 9])
    with pytest.raises(TransportError) as info:  # the kind has no priorities
        client.update_priorities(taken.keys, np.ones(2))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "no priorities" in str(info.value)
    status = memory.Status(None, None).counters
    assert status["memory/0/inserts"] == 10 and status["memory/0/size"] == 10
    assert status["memory/0/samples"] >= 6  # and what the prefetch took since


def test_a_kind_snapshots_and_restores_through_its_table(newest_dqn, tmp_path):
    cfg = newest_config(newest_dqn)
    spec = registry.replay_spec(cfg, *env_spaces("CartPole-v1"))
    path = tmp_path / "memory-0.npz"
    memory = memory_role.build(cfg, spec, 0, snapshot=path)
    try:
        memory._submit(memory_role.Op("insert", 1.0, batch=items(spec, 0, 5), n=5))
        assert memory.snapshot(path) == 5
    finally:
        memory.close()
    again = memory_role.build(cfg, spec, 0, snapshot=path)
    try:
        assert again.table.size == 5 and again.counters["restored_items"] == 5
    finally:
        again.close()


def test_the_kinds_own_check_and_unknown_kinds_fail_at_load(newest_dqn):
    with pytest.raises(ConfigError, match="replay.min_size_to_sample: must be <= replay.capacity"):
        newest_config(newest_dqn, min_size_to_sample=17)
    with pytest.raises(
        ConfigError, match="replay.kind: newest_dqn works with newest, got 'uniform'"
    ):
        newest_config(newest_dqn, kind="uniform")
    with pytest.raises(ConfigError, match=r"AlgorithmSpec: replay_kinds: unknown replay kind "):
        newest_config("unknown_kind_dqn")
    with pytest.raises(ConfigError, match="replay.kind: unknown replay kind 'unifrom'; did you "):
        kinds.get("unifrom")
    # A kind of one's own, by config alone: any algorithm whose items it can hold takes it.
    own = {"kind": "newest_kind:NEWEST"}
    assert newest_config("dqn", **own).replay.kind_spec is NEWEST
    with pytest.raises(ConfigError, match="ppo works with aggregate, .* take whole rounds"):
        config_lib.from_dict({"algorithm": {"name": "ppo"}, "replay": own})
    with pytest.raises(ConfigError, match="is a Kind, not|is a function, not a Kind"):
        newest_config("dqn", kind="newest_kind:build_newest")
    with pytest.raises(ConfigError, match="dqn works with prioritized or uniform, got 'trajec"):
        newest_config("dqn", kind="trajectory")
    with pytest.raises(ReplayError, match="letters, digits"):
        kinds.register(Kind("no such", build_newest))


@pytest.mark.parametrize(
    "name, batches, prioritized, frames, snapshots",
    [
        ("uniform", True, False, True, True),
        ("prioritized", True, True, True, True),
        ("trajectory", True, False, True, True),
        ("aggregate", False, False, False, False),
    ],
)
def test_the_built_in_kinds_say_what_the_runtime_reads(
    name, batches, prioritized, frames, snapshots
):
    kind = kinds.get(name)
    assert (kind.batches, kind.prioritized, kind.frames, kind.snapshots) == (
        batches,
        prioritized,
        frames,
        snapshots,
    )
    assert name in kinds.names()


def test_k8s_gives_memory_shards_time_to_snapshot_only_for_kinds_that_snapshot(newest_dqn):
    replay = 10 * k8s.DISK_BYTES_PER_S
    ppo = config_lib.from_dict({"algorithm": {"name": "ppo"}})
    assert k8s.grace_s(ppo, "memory", replay) == k8s.GRACE_S  # aggregate: no snapshot
    newest = newest_config(newest_dqn)
    assert k8s.grace_s(newest, "memory", replay) == k8s.GRACE_S + 10
    assert k8s.grace_s(newest, "actor", replay) == k8s.GRACE_S


def test_an_aggregate_shard_is_built_from_its_kind_with_the_cluster_sizing_its_rounds():
    cfg = config_lib.from_dict(
        {"algorithm": {"name": "ppo", "rollout_length": 8}, "env": {"num_envs": 2}}
    )
    spec = {"obs": ((4,), np.float32)}
    setup = memory_role.shard_setup(cfg, spec, 0)
    with pytest.raises(ReplayError, match="needs the cluster to size its rounds"):
        kinds.get("aggregate").build(setup)
    setup = dataclasses.replace(setup, round_size=lambda: 16)
    table = kinds.get("aggregate").build(setup)
    assert isinstance(table, AggregateTable) and table.round_size == table.batch_size == 16


def test_a_ring_samples_a_learners_batches_per_sample_ahead_and_anneals_beta_by_updates():
    """`learner.batches_per_sample: 4`: the shard samples 4 batches ahead per Sample; beta
    reaches its final value after `beta_anneal_steps` updates, i.e. a quarter as many
    Samples."""
    cfg = config_lib.from_dict(
        {
            "algorithm": {"name": "dqn", "batch_size": 32},
            "replay": {"kind": "prioritized", "beta": 0.4, "beta_anneal_steps": 100},
            "learner": {"batches_per_sample": 4},
        }
    )
    spec = {"obs": ((4,), np.float32)}
    table = kinds.get("prioritized").build(memory_role.shard_setup(cfg, spec, 0))
    assert isinstance(table, LimitedTable) and table.batch_size == 128
    assert table.beta(24) < 1.0 == table.beta(25)


def test_the_memory_server_holds_every_table_through_one_interface():
    source = Path(memory_role.__file__).read_text()
    assert "AggregateTable" not in source and '"aggregate"' not in source


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_kind_of_our_own_trains_cartpole_through_real_role_processes(newest_dqn, launch):
    """A built-in algorithm (DQN) on a kind defined outside the package, named in the config
    alone (`module:attribute`: every process imports the module from the path)."""
    budget = 1500
    run = launch(
        "algorithm.name=dqn",
        "replay.kind=newest_kind:NEWEST",
        f"stop.max_env_steps={budget}",
        "stop.max_seconds=150",
        *one_each(1),
    )
    code = run.wait(240)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert "max_env_steps" in summary["reason"], summary["reason"]
    ps, memory = _counters(summary, "ps/0"), _counters(summary, "memory/0")
    assert ps["env_steps"] >= budget and ps["ps/0/applied"] > 0, ps
    # Samples of the newest kind, through the same rate limiter as any ring (1 per insert).
    assert memory["memory/0/inserts"] > 0 and memory["memory/0/samples"] > 0
    assert memory["memory/0/sample_batches"] > 0
    assert "memory/0/priority_updates" not in memory  # the kind has no priorities
    assert config_lib.load(run.config_path).replay.kind == "newest_kind:NEWEST"
