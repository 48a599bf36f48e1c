"""An algorithm declares itself once, as `SPEC = AlgorithmSpec(...)`: the spec checks itself,
every built-in module declares one (and none of the module constants the runtime used to
probe), and a toy algorithm written outside the package, in this test, is loaded by the config
loader and the registry from its spec alone and trains CartPole through real role processes."""

import dataclasses
import io
import os
import subprocess
import sys

import docs_code
import numpy as np
import pytest
from rollouts import collect, joined

import easyrl
from easyrl import config as config_lib
from easyrl.algorithms import dqn, ppo, registry
from easyrl.algorithms.contract import AlgorithmSpec
from easyrl.errors import ConfigError

TOY = ("toy_q/__init__.py", "toy_q/agent.py")
"""The toy algorithm's files: docs/architecture.md's walkthrough code (`docs_code`)."""

CARTPOLE = {"algorithm": {"name": "toy_q", "lr": 0.05}, "env": {"id": "CartPole-v1"}}

TOY_ON_A_TOY_KIND = '''
"""The toy algorithm on the toy replay kind "newest" (a sampler of the newest items), which
importing newest_kind (docs/architecture.md's) registers: in every process of a run."""
import dataclasses

import newest_kind  # noqa: F401
import toy_q

SPEC = dataclasses.replace(toy_q.SPEC, replay_kinds=("newest",))
'''


@pytest.fixture
def toy_on_path(tmp_path, monkeypatch):
    """The toy algorithm as package `toy_q` in tmp_path, importable (as a user's own module
    is: the launcher hands its import path to the processes it starts)."""
    docs_code.write(tmp_path, *TOY, "newest_kind.py")
    (tmp_path / "toy_q_newest.py").write_text(TOY_ON_A_TOY_KIND)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The processes a run starts import the toys and the toy kind.
    path = [str(tmp_path), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    return tmp_path


def test_a_toy_algorithm_outside_the_package_loads_from_its_spec(toy_on_path):
    import toy_q

    cfg = config_lib.from_dict(CARTPOLE)
    assert registry.spec("toy_q") is toy_q.SPEC
    assert registry.params_class("toy_q") is toy_q.Params
    assert cfg.algorithm.params == toy_q.Params(lr=0.05) and cfg.replay.kind == "uniform"
    assert cfg.cluster.actor == 2  # an online run: actors by default
    # What the toy's spec leaves at the defaults, the config refuses, naming who can.
    refused = [
        ({"model": {"lstm": 8}}, "model.lstm: toy_q has no recurrent policy .*impala, ppo, r2d2"),
        ({"replay": {"kind": "prioritized"}}, "replay.kind: toy_q works with uniform"),
        ({"model": {"kind": "conv"}}, "model.kind: toy_q builds its networks from model.kind mlp"),
        (
            {"multiagent": {"policies": ["a"], "default_policy": "a"}},
            "multiagent: toy_q has no multi-agent training; algorithms with one: dqn, impala, ppo",
        ),
        ({"input": {"dir": str(toy_on_path)}}, "input.dir: toy_q cannot train from a dataset"),
    ]
    for extra, message in refused:
        with pytest.raises(ConfigError, match=message):
            config_lib.from_dict({**CARTPOLE, **extra})


def test_the_toy_agent_collects_and_learns_under_the_contract(toy_on_path):
    from easyrl.envs import env_spaces

    cfg = config_lib.from_dict(CARTPOLE)
    spec = registry.spec("toy_q")
    spaces = env_spaces("CartPole-v1")
    agent = spec.build(cfg.algorithm.params, *spaces, cfg.model, 0)
    batch = joined(collect(agent, "CartPole-v1", 4, 8))
    columns = spec.replay_spec(cfg.algorithm.params, *spaces)
    assert {k: (v.shape[1:], v.dtype) for k, v in batch.items()} == columns
    step = agent.learn(batch, None)
    assert [g.shape for g in step.grads] == [(4, 2), (2,)] and step.stats["loss"] > 0


def test_a_module_without_a_spec_is_refused_saying_what_to_declare(tmp_path, monkeypatch):
    (tmp_path / "constants_algo.py").write_text("FLOW = 'async_replay'\nREPLAY_KINDS = ()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"declares no SPEC = .*AlgorithmSpec\(flow=.*build="):
        config_lib.from_dict({"algorithm": {"name": "constants_algo"}})


@dataclasses.dataclass(frozen=True)
class _NoRuntimeKeys:
    gamma: float = 0.9


@pytest.mark.parametrize(
    "change, message",
    [
        ({"flow": "magic"}, "flow 'magic' is not one of async_replay, sync_rounds"),
        ({"replay_kinds": ("uniform", "fifo")}, "replay_kinds: unknown replay kind 'fifo'"),
        ({"replay_kinds": ("uniform", "uniform")}, r"replay_kinds .*: each kind once"),
        ({"round_share": ppo.round_share}, "round_share is required with flow sync_rounds, and"),
        ({"flow": "sync_rounds"}, "round_share is required with flow sync_rounds"),
        ({"dataset_items": None, "offline_only": True}, "offline_only needs dataset_items"),
        ({"flow": "actor_gradients"}, "dataset_items needs flow async_replay"),
        (
            {"flow": "actor_gradients", "dataset_items": None},
            "fused_update needs flow async_replay",
        ),
        ({"recurrence": "sometimes"}, "recurrence 'sometimes' is not one of no, optional, only"),
        ({"params_class": dict}, "params_class <class 'dict'> must be a dataclass"),
        ({"params_class": _NoRuntimeKeys}, "_NoRuntimeKeys lacks max_staleness, batch_size"),
    ],
)
def test_a_spec_whose_fields_do_not_fit_together_is_refused(change, message):
    with pytest.raises(ConfigError, match="AlgorithmSpec: " + message):
        dataclasses.replace(dqn.SPEC, **change)


def test_every_built_in_algorithm_declares_a_spec_and_no_probed_constants():
    old = ("FLOW", "REPLAY_KINDS", "MODEL_KINDS", "RECURRENT", "ACTION_MASKS", "OFFLINE_ONLY")
    for name in registry.known():
        module = registry.module(name)
        assert isinstance(module.SPEC, AlgorithmSpec), name
        assert not [c for c in old if c in vars(module)], name
    # Capabilities are read from the specs: the lists error messages offer.
    assert registry.known_where(lambda s: s.multiagent) == ["dqn", "impala", "ppo"]
    assert registry.known_where(lambda s: s.recurrence != "no") == ["a3c", "impala", "ppo", "r2d2"]
    assert registry.known_where(lambda s: s.offline_only) == ["bc", "bcq", "marwil"]
    assert registry.known_where(lambda s: s.action_logp) == ["bc", "marwil"]
    fused = ["bc", "bcq", "dqn", "impala", "marwil", "r2d2", "sac"]
    assert registry.known_where(lambda s: s.fused_update) == fused


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_the_toy_algorithm_on_a_toy_replay_kind_trains_cartpole_through_real_roles(
    toy_on_path,
):
    """Neither the algorithm nor the replay kind is easyrl's: both are defined in tests."""
    raw = {
        **CARTPOLE,
        "algorithm": {**CARTPOLE["algorithm"], "name": "toy_q_newest"},
        # More steps than the rate limiter lets the actors insert before the learner takes
        # its first batches (64 + an error buffer of 400): the run cannot stop before the
        # learner has learned.
        "stop": {"max_env_steps": 1000, "max_seconds": 90},
        "run": {"name": "toy", "dir": str(toy_on_path / "run")},
    }
    small = (
        "replay.min_size_to_sample=64",
        "replay.samples_per_insert=1.0",
        "replay.error_buffer=400",
        "cluster.actor=1",
        "env.num_envs=4",
        "run.log_interval_s=0.5",
    )
    out = io.StringIO()
    result = easyrl.train(raw, out=out, set=small)
    run_dir = toy_on_path / "run"
    logs = "\n".join(p.read_text()[-600:] for p in sorted(run_dir.glob("logs/*.log")))
    assert result.exit_code == 0, f"{result.reason}\n{out.getvalue()}\n{logs}"
    assert result.reached_goal and "max_env_steps" in result.reason
    assert result.summary["servers"]["memory/0"]["counters"]["memory/0/samples"] > 0
    assert result.metrics["env_steps"] >= 1000 and result.metrics["updates"] > 0
    with np.load(run_dir / "checkpoints" / "ps-0.npz") as data:
        assert {"var/q/w", "var/q/b"} <= set(data.files)  # the toy's variables on the PS
        trained, data_b = data["var/q/w"], data["var/q/b"]
    # `toy_q_newest` exposes only its SPEC (no module-level `build`): loading the run goes
    # through the spec, as every role does, and acts with the trained weights.
    assert not hasattr(__import__("toy_q_newest"), "build")
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    actions, _ = easyrl.load(run_dir).predict(obs)
    np.testing.assert_array_equal(actions, np.argmax(obs @ trained + data_b, axis=1))
    for command in (
        ["rollout", str(run_dir), "--episodes", "1"],
        ["export", str(run_dir), "--out", str(toy_on_path / "exported")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "easyrl.cli", *command], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_an_agent_whose_flow_is_not_its_specs_is_refused_when_built():
    """The config sizes the cluster from the spec's flow and the roles pick their loops from
    the agent's: `AlgorithmSpec.make`, which every caller builds through, checks they agree."""

    class Rounds:
        flow = "sync_rounds"

    spec = dataclasses.replace(dqn.SPEC, build=lambda *args: Rounds())
    with pytest.raises(ConfigError, match="Rounds.flow is 'sync_rounds', but its AlgorithmSpec"):
        spec.make(None, None, None, None)


def test_an_agent_without_the_fuse_update_its_spec_promises_is_refused_when_built():
    """A spec's `fused_update` says its agents are `FusingLearner`s: a lone learner calls
    their `fuse_update`. `AlgorithmSpec.make` checks the agent has it."""

    class Plain:
        flow = "async_replay"

    spec = dataclasses.replace(dqn.SPEC, build=lambda *args: Plain())
    with pytest.raises(ConfigError, match="Plain has no fuse_update, but its AlgorithmSpec"):
        spec.make(None, None, None, None)
    assert isinstance(
        dataclasses.replace(spec, fused_update=False).make(None, None, None, None), Plain
    )
