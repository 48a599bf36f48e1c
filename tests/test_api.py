"""The Python API (`easyrl.train`) and custom components named by dotted paths in a config.

Two tests run a real local cluster (every role a process, CartPole or the example's corridor,
an env-step budget): one in this process through `easyrl.train(dict)`, one the way a user runs
`examples/custom/train.py` (a config file plus overrides; its custom env and torso are imported
by every role process from the script's directory). The rest load configs, build networks and
envs, and check the error messages.
"""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import yaml
from rollouts import collect, joined

import easyrl
from easyrl import api, cli
from easyrl import config as config_lib
from easyrl.algorithms import dqn, registry
from easyrl.cluster.launcher import child_pythonpath
from easyrl.envs import env_spaces, make_vector_env
from easyrl.errors import ConfigError, EasyRLError

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "cartpole_apex.yaml"
EXAMPLE = ROOT / "examples" / "custom"

# Small and fast, as in test_cluster.py: the rate limiter couples the actors to the learner,
# so reaching the env-step budget needs the learner to have sampled (trained on) most of it.
SMALL = (
    "replay.min_size_to_sample=200",
    "replay.samples_per_insert=1.0",
    "replay.error_buffer=400",
    "cluster.actor=1",
    "env.num_envs=4",
    "algorithm.batch_size=32",
    "run.log_interval_s=0.5",
)
BUDGET = 1500


def _env() -> dict[str, str]:
    """A user's environment: easyrl importable (this checkout), no token, no cluster."""
    env = {k: v for k, v in os.environ.items() if k not in {"EASYRL_TOKEN", "EASYRL_CLUSTER"}}
    env["PYTHONPATH"] = str(ROOT)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


@pytest.fixture
def example_on_path(monkeypatch):
    """examples/custom importable in this process (as `train` makes a config's directory)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


# --- the package and the overrides -------------------------------------------------------


@pytest.mark.cluster
def test_import_easyrl_is_cheap_and_exports_train():
    code = textwrap.dedent(
        """
        import sys
        import easyrl
        heavy = [m for m in ("tensorflow", "grpc", "easyrl.api") if m in sys.modules]
        assert not heavy, heavy
        from easyrl import TrainResult, train
        import easyrl.api
        assert train is easyrl.api.train and TrainResult is easyrl.api.TrainResult
        from easyrl import Callback, Policy, load
        import easyrl.callbacks, easyrl.policy
        assert Callback is easyrl.callbacks.Callback and load is easyrl.policy.load
        assert Policy is easyrl.policy.Policy
        assert "tensorflow" not in sys.modules
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_overrides_merge_into_the_config_file():
    cfg = api.load_config(
        CONFIG,
        set=["stop.window=10", "stop.max_seconds=99"],
        stop={"max_seconds": 30},  # keyword sections are applied after `set`
        algorithm={"lr": 1e-5},
        env={"kwargs": {"sutton_barto_reward": True}},
    )
    assert cfg.stop.max_seconds == 30.0 and cfg.stop.window == 10
    assert cfg.stop.episode_return_mean == 450  # the file's keys next to an override stay
    assert cfg.algorithm.params.lr == 1e-5 and cfg.algorithm.params.batch_size == 512
    assert cfg.env.kwargs == {"sutton_barto_reward": True}
    assert cfg.model.hidden == (256,)


def test_a_dict_or_a_config_takes_overrides_too():
    cfg = api.load_config(
        {"algorithm": {"name": "ppo"}}, cluster={"actor": 3}, model={"hidden": [8]}
    )
    assert cfg.cluster.actor == 3 and cfg.model.hidden == (8,)
    again = api.load_config(cfg, algorithm={"clip": 0.1})
    assert again.algorithm.params.clip == 0.1
    assert again.cluster == cfg.cluster and again.model == cfg.model


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"stop": {"max_secnds": 5}},
            "unknown key 'stop.max_secnds'; did you mean 'stop.max_seconds'",
        ),
        ({"stpo": {"max_seconds": 5}}, "unknown key 'stpo'; did you mean 'stop'"),
        ({"algorithm": {"gama": 0.9}}, "did you mean 'algorithm.gamma'"),
        ({"stop": {"max_seconds": "soon"}}, "stop.max_seconds: expected float"),
        ({"stop": {"max_seconds": np.float32(5)}}, "stop.max_seconds: float32"),
        ({"set": "stop.max_seconds=5"}, "expected a list of dotted.key=value strings"),
    ],
)
def test_bad_overrides_fail_before_anything_starts(tmp_path, overrides, message):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        easyrl.train(CONFIG, **overrides, run={"dir": str(run_dir)})
    assert not run_dir.exists()


def test_config_argument_of_the_wrong_kind():
    with pytest.raises(ConfigError, match="expected a config file path, a config mapping"):
        api.load_config(42)
    with pytest.raises(ConfigError, match="cannot read config file"):
        api.load_config(ROOT / "configs" / "missing.yaml")


def test_train_outside_the_main_thread_is_refused(tmp_path):
    errors = []

    def call():
        try:
            easyrl.train(CONFIG, run={"dir": str(tmp_path / "run")})
        except EasyRLError as err:
            errors.append(err)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=30)
    assert len(errors) == 1 and "main thread" in str(errors[0])
    assert not (tmp_path / "run").exists()


def test_cli_train_reports_a_bad_key(capsys):
    assert cli.main(["train", str(CONFIG), "--set", "stop.max_secnds=3"]) == 2
    assert "did you mean 'stop.max_seconds'" in capsys.readouterr().err


# --- real runs ---------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_train_a_dict_config_runs_a_local_cluster(tmp_path):
    raw = {
        "algorithm": {"name": "dqn"},
        "env": {"id": "CartPole-v1"},
        "stop": {"max_env_steps": BUDGET, "max_seconds": 90},
        "run": {"name": "api-dict", "dir": str(tmp_path / "run")},
    }
    handler = signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    result = easyrl.train(raw, out=out, set=SMALL)
    logs = "\n".join(p.read_text()[-600:] for p in sorted(tmp_path.glob("run/logs/*.log")))
    assert result.exit_code == 0, f"{result.reason}\n{out.getvalue()}\n{logs}"
    assert signal.getsignal(signal.SIGTERM) is handler  # the launcher's handler is undone
    assert result.reached_goal and "max_env_steps" in result.reason
    assert result.run_dir == (tmp_path / "run").resolve() and result.run_dir.is_dir()
    assert f"run directory: {result.run_dir}" in out.getvalue()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert result.summary == summary and summary["exit_code"] == 0
    assert result.elapsed_s == summary["elapsed_s"] > 0
    assert result.metrics["env_steps"] >= BUDGET
    assert result.metrics["updates"] > 0 and result.metrics["episodes"] > 0
    saved = config_lib.load(result.run_dir / "config.yaml")
    assert saved.cluster.actor == 1 and saved.algorithm.params.batch_size == 32


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_example_trains_a_custom_env_and_network_by_dotted_paths(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, str(EXAMPLE / "train.py"), "--seed", "3"]
    overrides = [
        *SMALL,
        "stop.episode_return_mean=null",  # a budget stop then counts as success
        f"stop.max_env_steps={BUDGET}",
        "stop.max_seconds=90",
        f"run.dir={run_dir}",
    ]
    for override in overrides:
        command += ["--set", override]
    # cwd elsewhere and only easyrl on PYTHONPATH: the script's directory is where the
    # launcher and every role process find my_envs and my_nets.
    done = subprocess.run(
        command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=140
    )
    logs = "\n".join(p.read_text()[-600:] for p in sorted(run_dir.glob("logs/*.log")))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-2000:]}\n{logs}"
    assert f"reached the goal: max_env_steps {BUDGET:,} reached at " in done.stdout
    assert f"run directory {run_dir.resolve()}" in done.stdout
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())  # my_nets is not on our path
    assert saved["env"]["id"] == "my_envs:Corridor"
    assert saved["model"]["kind"] == "my_nets:ResidualMLP"
    assert saved["run"]["seed"] == 3 and saved["cluster"]["actor"] == 1
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["env_steps"] >= BUDGET and metrics[-1]["updates"] > 0
    assert metrics[-1]["episodes"] > 0
    with np.load(run_dir / "checkpoints" / "ps-0.npz") as data:
        # The PS holds the custom torso's variables: its residual blocks under q/torso.
        assert {"var/q/torso/in/w", "var/q/torso/block0/w", "var/q/torso/block1/w"} <= set(
            data.files
        )


# --- custom environments -----------------------------------------------------------------


def test_env_class_by_module_path(example_on_path):
    env = make_vector_env("my_envs:Corridor", 2, kwargs={"length": 4, "max_steps": 10})
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 4) and (obs[:, 0] == 1).all()
        for _ in range(2):
            obs, rewards, terminated, _, _ = env.step(np.ones(2, np.int64))
            assert not terminated.any() and np.allclose(rewards, -0.01)
        _, rewards, terminated, _, _ = env.step(np.ones(2, np.int64))
        assert terminated.all() and np.allclose(rewards, 1.0)
    finally:
        env.close()
    assert "easyrl-custom/my_envs.Corridor-v0" in gymnasium.registry


def test_registered_id_by_module_path_still_works():
    env = make_vector_env("gymnasium.envs.classic_control:CartPole-v1", 1)
    try:
        assert env.reset(seed=0)[0].shape == (1, 4)
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("my_envs:Corider", "module 'my_envs' defines no environment class or function 'Corider'"),
        ("no_such_module_xyz:Env", "cannot import module 'no_such_module_xyz' of environment id"),
    ],
)
def test_bad_env_paths(example_on_path, env_id, message):
    with pytest.raises(ConfigError, match=message):
        make_vector_env(env_id, 1)


# --- custom networks ---------------------------------------------------------------------


def test_custom_torso_builds_under_the_contract(example_on_path):
    import tensorflow as tf

    from easyrl.models import build_torso, named_variables

    cfg = api.load_config({"algorithm": {"name": "dqn"}}, model={"kind": "my_nets:ResidualMLP"})
    torso = build_torso(cfg.model, (5,), "q/torso", np.random.default_rng(0))
    assert torso.out_dim == 64
    assert set(named_variables(torso)) == {
        f"q/torso/{layer}/{v}" for layer in ("in", "block0") for v in ("w", "b")
    }
    features = torso(tf.ones([3, 5]))
    assert features.shape == (3, 64) and features.dtype == tf.float32
    again = build_torso(cfg.model, (5,), "q/torso", np.random.default_rng(0))
    assert np.array_equal(again.inp.w.numpy(), torso.inp.w.numpy())  # same rng, same weights


BAD_TORSOS = """
import tensorflow as tf

class Unnamed(tf.Module):
    def __init__(self, model, obs_shape, name, rng):
        super().__init__()
        self.w = tf.Variable(tf.zeros([obs_shape[0], 4]))
        self.out_dim = 4

class NoWidth(tf.Module):
    def __init__(self, model, obs_shape, name, rng):
        super().__init__()
        self.w = tf.Variable(tf.zeros([obs_shape[0], 4]), name=f"{name}/w")

def not_a_module(model, obs_shape, name, rng):
    return lambda obs: obs
"""


@pytest.mark.parametrize(
    "kind, message",
    [
        ("bad_torsos:Unnamed", "explicit unique name under 'q/torso/'"),
        ("bad_torsos:NoWidth", "out_dim must be a positive int"),
        ("bad_torsos:not_a_module", "not a tf.Module"),
    ],
)
def test_custom_torso_breaking_the_contract(tmp_path, monkeypatch, kind, message):
    from easyrl.models import build_torso

    (tmp_path / "bad_torsos.py").write_text(BAD_TORSOS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = api.load_config({"algorithm": {"name": "dqn"}}, model={"kind": kind})
    with pytest.raises(ValueError, match=message):
        build_torso(cfg.model, (3,), "q/torso", np.random.default_rng(0))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("lstm", "model.kind must be mlp, conv or module:Class, got 'lstm'"),
        ("no_such_module_xyz:Net", "cannot import module 'no_such_module_xyz' of model.kind"),
        ("my_nets:Resnet", "model.kind: module 'my_nets' has no attribute 'Resnet'"),
        ("my_nets:ACTIVATIONS", "model.kind: 'my_nets:ACTIVATIONS' is not a class or function"),
        ("my_nets:", "model.kind: expected 'package.module:attribute'"),
    ],
)
def test_bad_model_kinds_fail_at_load(example_on_path, kind, message):
    with pytest.raises(ConfigError, match=message):
        config_lib.from_dict({"algorithm": {"name": "dqn"}, "model": {"kind": kind}})


# --- custom algorithms -------------------------------------------------------------------

UNIFORM_DQN = '''
"""DQN under a name of its own, with uniform replay as its default table."""
import dataclasses

from easyrl.algorithms import dqn
from easyrl.algorithms.dqn import Params

SPEC = dataclasses.replace(dqn.SPEC, replay_kinds=("uniform",), params_class=Params)
'''


@pytest.fixture
def algorithms_on_path(tmp_path, monkeypatch):
    """tmp_path importable, holding `my_algos.dqn_uniform`, `flat_algo` and broken modules."""
    (tmp_path / "my_algos").mkdir()
    (tmp_path / "my_algos" / "__init__.py").write_text("")
    (tmp_path / "my_algos" / "dqn_uniform.py").write_text(UNIFORM_DQN)
    (tmp_path / "flat_algo.py").write_text(UNIFORM_DQN)
    (tmp_path / "half_algo.py").write_text("FLOW = 'async_replay'\nREPLAY_KINDS = ()\n")
    bogus = UNIFORM_DQN.replace('replay_kinds=("uniform",)', 'flow="magic"')
    (tmp_path / "bogus_flow_algo.py").write_text(bogus)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("name", ["my_algos.dqn_uniform", "flat_algo"])
def test_custom_algorithm_module_by_name(algorithms_on_path, name):
    cfg = config_lib.from_dict({"algorithm": {"name": name, "gamma": 0.9}})
    assert registry.module(name) is sys.modules[name]
    assert isinstance(cfg.algorithm.params, dqn.Params) and cfg.algorithm.params.gamma == 0.9
    assert cfg.replay.kind == "uniform"  # the module's SPEC.replay_kinds, not DQN's
    with pytest.raises(ConfigError, match="replay.kind: .* works with uniform, got 'prioritized'"):
        config_lib.from_dict({"algorithm": {"name": name}, "replay": {"kind": "prioritized"}})
    with pytest.raises(ConfigError, match="did you mean 'algorithm.gamma'"):
        config_lib.from_dict({"algorithm": {"name": name, "gama": 0.9}})


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_such_pkg_xyz.algo", "cannot import module 'no_such_pkg_xyz.algo' of algorithm.name"),
        ("half_algo", "module 'half_algo' is not an algorithm module: it declares no SPEC = "),
        (
            "bogus_flow_algo",
            "module 'bogus_flow_algo': AlgorithmSpec: flow 'magic' is not one of async_replay, ",
        ),
        ("ppg", "unknown algorithm 'ppg'; known algorithms: a2c, a3c, .*dqn, .*td3 \\(or the name"),
    ],
)
def test_bad_algorithm_names(algorithms_on_path, name, message):
    with pytest.raises(ConfigError, match=message):
        config_lib.from_dict({"algorithm": {"name": name}})


def test_params_lacking_what_the_runtime_reads_fail_at_load(algorithms_on_path, tmp_path):
    module = textwrap.dedent(
        """
        import dataclasses
        from dataclasses import dataclass

        from easyrl.algorithms import dqn

        @dataclass(frozen=True)
        class Params:
            gamma: float = 0.9

        SPEC = dataclasses.replace(dqn.SPEC, params_class=Params)
        """
    )
    (tmp_path / "no_batch_algo.py").write_text(module)
    lacks = "no_batch_algo': AlgorithmSpec: Params lacks max_staleness, batch_size"
    with pytest.raises(ConfigError, match=lacks):
        config_lib.from_dict({"algorithm": {"name": "no_batch_algo"}})


def test_example_algorithm_follows_the_contract_and_learns_from_its_own_items(example_on_path):
    from easyrl.algorithms.contract import LearnStep

    cfg = config_lib.load(EXAMPLE / "algo.yaml")
    assert cfg.replay.kind == "uniform" and cfg.algorithm.params.batch_size == 64
    module = registry.module("my_algo")
    agent = module.build(cfg.algorithm.params, *env_spaces("CartPole-v1"), cfg.model, 0)
    batch = joined(collect(agent, "CartPole-v1", 4, 16))
    spec = module.replay_spec(cfg.algorithm.params, *env_spaces("CartPole-v1"))
    assert {k: (v.shape[1:], v.dtype) for k, v in batch.items()} == spec
    step = agent.learn(batch, None)
    assert isinstance(step, LearnStep) and step.priorities is None
    shapes = [tuple(v.shape) for v in agent.variables.values()]
    assert [g.shape for g in step.grads] == shapes and any(np.any(g != 0) for g in step.grads)
    assert set(step.stats) == {"loss", "q_mean"} and np.isfinite(step.stats["loss"])


# --- the role processes' import path -----------------------------------------------------


def test_child_pythonpath_carries_the_launchers_own_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path[1:], str(tmp_path)])
    entries = child_pythonpath(f"already{os.pathsep}{tmp_path}").split(os.pathsep)
    assert entries[:2] == [os.getcwd(), str(tmp_path)]
    assert entries[-1] == "already" and len(entries) == len(set(entries))
    assert not any(e.startswith(sys.base_prefix) for e in entries)  # the stdlib, site-packages


@pytest.mark.parametrize(
    "name, kind, accepted",
    [
        ("dqn", "my_nets:ResidualMLP", True),
        ("impala", "my_nets:ResidualMLP", True),
        ("a3c", "my_nets:ResidualMLP", True),
        ("ppo", "my_nets:ResidualMLP", True),
        ("sac", "my_nets:ResidualMLP", True),
        ("es", "my_nets:ResidualMLP", True),
        ("ppo", "conv", False),
        ("td3", "conv", False),
    ],
)
def test_model_kind_must_suit_the_algorithm_at_load(example_on_path, name, kind, accepted):
    raw = {"algorithm": {"name": name}, "model": {"kind": kind}}
    if name == "sac":
        raw["env"] = {"id": "Pendulum-v1"}
    if accepted:
        assert config_lib.from_dict(raw).model.kind == kind
        return
    with pytest.raises(ConfigError, match=rf"model.kind: {name} builds its networks from model"):
        config_lib.from_dict(raw)
