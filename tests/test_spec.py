"""An algorithm declares itself once, as `SPEC = AlgorithmSpec(...)`: the spec checks itself,
every built-in module declares one (and none of the module constants the runtime used to
probe), and a toy algorithm written outside the package, in this test, is loaded by the config
loader and the registry from its spec alone and trains CartPole through real role processes."""

import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rollouts import collect, joined

import easyrl
from easyrl import config as config_lib
from easyrl.algorithms import dqn, ppo, registry
from easyrl.algorithms.contract import AlgorithmSpec
from easyrl.errors import ConfigError

TOY_SPEC = '''
"""A toy algorithm outside easyrl: one-step Q-learning with a linear Q function (no target
network) on uniform replay. This module is what loading a config reads; `agent` is the
TensorFlow side."""
from dataclasses import dataclass

import numpy as np

from easyrl.algorithms.contract import AlgorithmSpec


@dataclass(frozen=True)
class Params:
    """The config's `algorithm` keys."""

    gamma: float = 0.99
    """Discount factor."""
    lr: float = 0.01
    """SGD learning rate."""
    epsilon: float = 0.2
    """Exploration rate."""
    batch_size: int = 32
    """Transitions per learner batch (read by the runtime)."""
    max_staleness: int = 100
    """PS shards drop older gradients (read by the runtime)."""


def optimizer(params):
    from easyrl.algorithms.optimizers import OptimizerSpec

    return OptimizerSpec(kind="sgd", lr=params.lr)


def replay_spec(params, obs_space, action_space):
    obs, scalar = (tuple(obs_space.shape), np.dtype(np.float32)), ((), np.dtype(np.float32))
    columns = {"obs": obs, "action": ((), np.dtype(np.int64)), "reward": scalar}
    return {**columns, "next_obs": obs, "discount": scalar}


def build(params, obs_space, action_space, model, seed=0, learner=False):
    from toy_q.agent import LinearQ

    return LinearQ(params, int(obs_space.shape[0]), int(action_space.n), seed)


SPEC = AlgorithmSpec(
    flow="async_replay",
    replay_kinds=("uniform",),
    params_class=Params,
    build=build,
    optimizer=optimizer,
    replay_spec=replay_spec,
)
'''

TOY_AGENT = '''
"""The toy's agent: Q(s, .) = s W + b; loss 0.5 * mean((y - Q(s, a))^2),
y = r + discount * max_a' Q(s', a')."""
import numpy as np
import tensorflow as tf

from easyrl.algorithms.contract import LearnStep
from toy_q import SPEC


class LinearQ:
    flow = SPEC.flow
    target_update_period = 0  # no target network

    def __init__(self, params, obs_dim, num_actions, seed):
        self.params, self.num_actions = params, num_actions
        w = np.random.default_rng(seed).normal(0.0, 0.1, (obs_dim, num_actions))
        self.variables = {
            "q/w": tf.Variable(w.astype(np.float32)),
            "q/b": tf.Variable(np.zeros(num_actions, np.float32)),
        }
        obs_spec = tf.TensorSpec([None, obs_dim], tf.float32)
        self.greedy_fn = tf.function(  # what easyrl.load, rollout and export run
            lambda obs: tf.argmax(self.q(obs), axis=1), input_signature=[obs_spec]
        )

    def q(self, obs):
        w, b = self.variables["q/w"], self.variables["q/b"]
        return tf.matmul(tf.cast(obs, tf.float32), w) + b

    def greedy(self, obs):
        return np.argmax(self.q(obs).numpy(), axis=1)

    def learn(self, batch, weights):
        y = batch["reward"] + batch["discount"] * self.q(batch["next_obs"]).numpy().max(axis=1)
        with tf.GradientTape() as tape:
            q_sa = tf.gather(self.q(batch["obs"]), batch["action"], axis=1, batch_dims=1)
            loss = 0.5 * tf.reduce_mean((y - q_sa) ** 2)
        grads = tape.gradient(loss, list(self.variables.values()))
        return LearnStep([g.numpy() for g in grads], {"loss": float(loss)})

    def sync_target(self):
        pass

    def collector(self, num_envs, seed, actor_index, num_actors):
        return EpsilonGreedy(self)


class EpsilonGreedy:
    last_action_logp = None

    def __init__(self, agent):
        self.agent = agent

    def act(self, obs, rng):
        explore = rng.random(len(obs)) < self.agent.params.epsilon
        random = rng.integers(self.agent.num_actions, size=len(obs))
        self._obs = np.asarray(obs, np.float32)
        self._actions = np.where(explore, random, self.agent.greedy(obs)).astype(np.int64)
        return self._actions

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated):
        gamma = np.float32(self.agent.params.gamma)
        return {
            "obs": self._obs,
            "action": self._actions,
            "reward": np.asarray(rewards, np.float32),
            "next_obs": np.asarray(real_next_obs, np.float32),
            "discount": np.where(terminated, 0.0, gamma).astype(np.float32),
        }

    def stats(self):
        return {"epsilon": self.agent.params.epsilon}
'''

CARTPOLE = {"algorithm": {"name": "toy_q", "lr": 0.05}, "env": {"id": "CartPole-v1"}}

TOY_ON_A_TOY_KIND = '''
"""The toy algorithm on the toy replay kind "newest" (a sampler of the newest items), which
tests/test_replay_kinds.py registers when it is imported: in every process of a run."""
import dataclasses

import test_replay_kinds  # noqa: F401
import toy_q

SPEC = dataclasses.replace(toy_q.SPEC, replay_kinds=("newest",))
'''


@pytest.fixture
def toy_on_path(tmp_path, monkeypatch):
    """The toy algorithm as package `toy_q` in tmp_path, importable (as a user's own module
    is: the launcher hands its import path to the processes it starts)."""
    (tmp_path / "toy_q").mkdir()
    (tmp_path / "toy_q" / "__init__.py").write_text(TOY_SPEC)
    (tmp_path / "toy_q" / "agent.py").write_text(TOY_AGENT)
    (tmp_path / "toy_q_newest.py").write_text(TOY_ON_A_TOY_KIND)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The processes a run starts import the toys and tests/test_replay_kinds.py (the kind).
    path = [str(tmp_path), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
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


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_the_toy_algorithm_on_a_toy_replay_kind_trains_cartpole_through_real_roles(
    toy_on_path,
):
    """Neither the algorithm nor the replay kind is easyrl's: both are defined in tests."""
    raw = {
        **CARTPOLE,
        "algorithm": {**CARTPOLE["algorithm"], "name": "toy_q_newest"},
        "stop": {"max_env_steps": 400, "max_seconds": 90},
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
    assert result.metrics["env_steps"] >= 400 and result.metrics["updates"] > 0
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
