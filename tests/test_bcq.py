"""Tests of discrete BCQ (easyrl.algorithms.bcq) and batch DQN's `dataset_items`: the action
constraint on a hand example, the loss pieces against a numpy reference, the n-step items of
a dataset against a hand-computed example (episode ends included) and the actors'
accumulator, and an offline `easyrl train configs/cartpole_bcq.yaml` run."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from easyrl import config as config_lib
from easyrl.algorithms import bcq, dqn, registry
from easyrl.algorithms.bcq.agent import STAT_NAMES, allowed_actions, constrained_argmax
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.algorithms.optimizers import LocalOptimizer
from easyrl.config import ModelConfig
from easyrl.envs import env_spaces, final_observations, make_vector_env
from easyrl.errors import ConfigError
from easyrl.offline.dataset import DatasetError, DatasetWriter, list_shards, make_schema, read_steps
from easyrl.roles import memory as memory_role

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cartpole_bcq.yaml"
OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)
ACTIONS = gym.spaces.Discrete(3)
MODEL = ModelConfig(hidden=(8,), activation="relu")


def build(**changes):
    changes.setdefault("grad_clip", 0.0)
    return bcq.build(bcq.Params(**changes), OBS_SPACE, ACTIONS, MODEL, seed=3)


# --- the action constraint ------------------------------------------------------------------

# G(.|s) = (0.5, 0.1, 0.4): ratios to the most likely action (1, 0.2, 0.8).
PROBS = [0.5, 0.1, 0.4]
Q = [1.0, 5.0, 2.0]


@pytest.mark.parametrize(
    "threshold, allowed, best",
    [
        (0.0, [True, True, True], 1),  # no constraint: DQN's argmax
        (0.3, [True, False, True], 2),  # action 1 is too rare in the data
        (0.9, [True, False, False], 0),  # only the most logged action: behaviour cloning
    ],
)
def test_threshold_masks_actions(threshold, allowed, best):
    logits = np.log(np.array([PROBS], np.float32)) + 7.0  # any shift: only ratios count
    np.testing.assert_array_equal(allowed_actions(logits, threshold).numpy(), [allowed])
    assert constrained_argmax(np.array([Q], np.float32), logits, threshold).numpy() == [best]

    # The agent acts the same way: heads set so that the classifier's logits are log PROBS
    # and Q's advantages are Q whatever the observation (the dueling value shifts all actions).
    agent = build(threshold=threshold)
    for name, value in {
        "bc/logits/w": np.zeros((8, 3)),
        "bc/logits/b": np.log(PROBS),
        "q/advantage/w": np.zeros((8, 3)),
        "q/advantage/b": Q,
    }.items():
        agent.variables[name].assign(np.asarray(value, np.float32))
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(agent.greedy(obs), [best] * 5)


# --- the loss -------------------------------------------------------------------------------

BATCH = {
    "obs": np.array([[1.0, 0.5, -0.5, 2.0], [-1.0, 1.5, 0.5, 0.0], [0.3, -0.7, 1.2, 0.4]]),
    "action": np.array([0, 2, 1]),
    "reward": np.array([1.0, -2.0, 0.3]),
    "next_obs": np.array([[0.8, 1.0, -0.2, 1.5], [0.0, 2.0, 1.0, -0.5], [1.5, -1.0, 0.6, 0.9]]),
    "discount": np.array([0.9, 0.0, 0.81]),  # the second transition ends its episode
}
WEIGHTS = np.array([1.0, 0.5, 2.0])


def reference(agent, threshold, bc_weight, logit_reg, double_q=True, delta=1.0):
    """The loss pieces in float64 numpy from the networks' outputs."""
    f = lambda net, x: net(np.asarray(x, np.float32)).numpy().astype(np.float64)  # noqa: E731
    q, q_next = f(agent.q, BATCH["obs"]), f(agent.q, BATCH["next_obs"])
    target_next = f(agent.target, BATCH["next_obs"])
    logits, logits_next = f(agent.bc, BATCH["obs"]), f(agent.bc, BATCH["next_obs"])

    def allowed(lg):  # G(a|s) / max_a' G(a'|s) > threshold, from the softmax probabilities
        g = np.exp(lg) / np.exp(lg).sum(axis=1, keepdims=True)
        return g / g.max(axis=1, keepdims=True) > threshold

    chooser = q_next if double_q else target_next
    best = np.argmax(np.where(allowed(logits_next), chooser, -np.inf), axis=1)
    rows = np.arange(3)
    y = BATCH["reward"] + BATCH["discount"] * target_next[rows, best]
    td = y - q[rows, BATCH["action"]]
    a = np.abs(td)
    huber = np.where(a <= delta, 0.5 * td**2, delta * (a - 0.5 * delta))
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    nll = -log_probs[rows, BATCH["action"]]
    q_loss, bc_loss = np.mean(WEIGHTS * huber), np.mean(WEIGHTS * nll)
    loss = q_loss + bc_weight * bc_loss + logit_reg * np.mean(logits**2)
    stats = {
        "loss": loss,
        "q_loss": q_loss,
        "bc_loss": bc_loss,
        "q_mean": q[rows, BATCH["action"]].mean(),
        "allowed_fraction": allowed(logits).mean(),
    }
    return stats, np.abs(td), best


@pytest.mark.parametrize("double_q", [True, False])
def test_loss_pieces_match_reference(double_q):
    agent = build(threshold=0.5, bc_weight=0.7, logit_reg=0.1, double_q=double_q)
    # A classifier that prefers action 0, strongly enough that the constraint changes targets.
    agent.variables["bc/logits/b"].assign(np.array([1.5, 0.0, 1.2], np.float32))
    agent.variables["q/advantage/b"].assign(np.array([0.0, 3.0, -1.0], np.float32))
    agent.sync_target()
    agent.variables["q/advantage/b"].assign(np.array([0.0, 2.0, 1.0], np.float32))
    expected, td_abs, best = reference(agent, 0.5, 0.7, 0.1, double_q)
    # The best Q (action 1) is masked out: the constraint bites; among the allowed actions
    # the online Q prefers 2, the target 0.
    np.testing.assert_array_equal(best, [2 if double_q else 0] * 3)
    grads, stats, priorities = agent.learn(BATCH, WEIGHTS)
    assert set(stats) == set(STAT_NAMES)
    for name, value in expected.items():
        assert stats[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    np.testing.assert_allclose(priorities, td_abs, rtol=1e-5, atol=1e-6)
    assert [g.shape for g in grads] == [tuple(v.shape) for v in agent.variables.values()]
    assert any(n.startswith("bc/") for n in agent.variables)
    assert any(n.startswith("q/") for n in agent.variables)
    assert not any(n.startswith("target/") for n in agent.variables)
    # The target network copies Q only.
    agent.sync_target()
    target = {v.name.removesuffix(":0"): v for v in agent.target.trainable_variables}
    np.testing.assert_array_equal(target["target/advantage/b"].numpy(), [0.0, 2.0, 1.0])


def test_threshold_zero_q_loss_is_dqns_loss():
    """With tau = 0 the TD part is DQN's (same seed: same Q and target networks), and the
    classifier only gets the cross-entropy (+ regularization) gradients."""
    agent = build(threshold=0.0)
    plain = dqn.build(dqn.Params(grad_clip=0.0), OBS_SPACE, ACTIONS, MODEL, seed=3)
    dqn_grads, dqn_stats, dqn_td = plain.learn(BATCH, WEIGHTS)
    grads, stats, td = agent.learn(BATCH, WEIGHTS)
    assert stats["q_loss"] == pytest.approx(dqn_stats["loss"], rel=1e-6)
    np.testing.assert_allclose(td, dqn_td, rtol=1e-6)
    by_name = dict(zip(agent.variables, grads, strict=True))
    for name, grad in zip(plain.variables, dqn_grads, strict=True):
        np.testing.assert_allclose(by_name[name], grad, rtol=1e-5, atol=1e-7)
    no_bc = build(threshold=0.0, bc_weight=0.0, logit_reg=0.0)
    grads, _, _ = no_bc.learn(BATCH, WEIGHTS)
    for name, grad in zip(no_bc.variables, grads, strict=True):
        if name.startswith("bc/"):
            np.testing.assert_array_equal(grad, 0.0)


def test_params_and_registry():
    module = registry.module("bcq")
    assert module.SPEC.offline_only and module.SPEC.flow == "async_replay"
    assert module.dataset_items is dqn.dataset_items
    for change, match in [
        ({"threshold": 1.0}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"bc_weight": float("nan")}, "bc_weight"),
        ({"logit_reg": -1.0}, "logit_reg"),
        ({"n_step": 0}, "n_step"),
    ]:
        with pytest.raises(ConfigError, match=match):
            bcq.Params(**change)


def test_config_without_dataset_names_the_record_command(tmp_path):
    with pytest.raises(ConfigError, match="cartpole_record.yaml"):
        config_lib.load(CONFIG, [f"input.dir={tmp_path / 'missing'}"])


# --- batch DQN: the n-step items of a dataset ---------------------------------------------


def episode_rows(episode, obs, rewards, final_obs, terminated):
    """The dataset rows of one episode: next_obs is the following obs, then `final_obs`."""
    n = len(rewards)
    return {
        "obs": np.array(obs, np.float32)[:, None],
        "action": np.arange(n) % 2,
        "reward": np.array(rewards, np.float32),
        "terminated": np.arange(n) == n - 1 if terminated else np.zeros(n, bool),
        "truncated": np.zeros(n, bool) if terminated else np.arange(n) == n - 1,
        "next_obs": np.array([*obs[1:], final_obs], np.float32)[:, None],
        "episode": np.full(n, episode, np.int64),
        "t": np.arange(n, dtype=np.int32),
    }


def dataset(*episodes):
    return {k: np.concatenate([e[k] for e in episodes]) for k in episodes[0]}


# Episode 5 terminates after 4 steps (observations 0..3, final 4); episode 9 is truncated
# after 2 steps (observations 10, 11, final 12).
STEPS = dataset(
    episode_rows(5, [0, 1, 2, 3], [1, 2, 3, 4], 4, terminated=True),
    episode_rows(9, [10, 11], [10, 20], 12, terminated=False),
)


def test_dataset_items_hand_computed_n_step_with_episode_ends():
    items = dqn.dataset_items(dqn.Params(n_step=3, gamma=0.5), STEPS)
    assert set(items) == set(dqn.replay_spec(dqn.Params(), gym.spaces.Box(0, 1, (1,)), None))
    # By hand, n = 3, gamma = 0.5:
    #   t0: 1 + 0.5*2 + 0.25*3 = 2.75, next obs 3, discount 0.125
    #   t1: 2 + 0.5*3 + 0.25*4 = 4.5, next 4 (final), terminated: 0
    #   t2: 3 + 0.5*4 = 5, next 4, 0;   t3: 4, next 4, 0
    #   episode 9 (truncated: bootstrap from its final obs 12):
    #   t0: 10 + 0.5*20 = 20, discount 0.25;   t1: 20, discount 0.5
    np.testing.assert_allclose(items["reward"], [2.75, 4.5, 5, 4, 20, 20])
    np.testing.assert_array_equal(items["next_obs"][:, 0], [3, 4, 4, 4, 12, 12])
    np.testing.assert_array_equal(items["discount"], [0.125, 0, 0, 0, 0.25, 0.5])
    np.testing.assert_array_equal(items["obs"][:, 0], [0, 1, 2, 3, 10, 11])
    np.testing.assert_array_equal(items["action"], [0, 1, 0, 1, 0, 1])
    assert items["action"].dtype == np.int64 and items["reward"].dtype == np.float32
    # n = 1: plain 1-step transitions.
    one = dqn.dataset_items(dqn.Params(n_step=1, gamma=0.5), STEPS)
    np.testing.assert_array_equal(one["reward"], STEPS["reward"])
    np.testing.assert_array_equal(one["next_obs"], STEPS["next_obs"])
    np.testing.assert_array_equal(one["discount"], [0.5, 0.5, 0.5, 0, 0.5, 0.5])


def test_dataset_items_are_what_the_actors_accumulator_makes():
    params = dqn.Params(n_step=3, gamma=0.9)
    rng = np.random.default_rng(1)
    episodes = [
        episode_rows(e, rng.normal(size=n), rng.normal(size=n), 99.0, terminated=e % 2 == 0)
        for e, n in enumerate([1, 2, 3, 5, 7])
    ]
    items = dqn.dataset_items(params, dataset(*episodes))
    acc = NStepAccumulator(1, params.n_step, params.gamma, (1,), np.float32)
    parts = []
    for e in episodes:
        for t in range(len(e["t"])):
            row = {k: e[k][t : t + 1] for k in e}
            out = acc.add(row["obs"], row["action"], row["reward"], row["next_obs"],
                          row["terminated"], row["truncated"])  # fmt: skip
            if out is not None:
                parts.append(out)
    expected = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    for name, value in expected.items():
        np.testing.assert_allclose(items[name], value, rtol=1e-6, err_msg=name)


def test_dataset_items_refuse_broken_episodes():
    ends_early = {k: v.copy() for k, v in STEPS.items()}
    ends_early["terminated"][1] = True
    with pytest.raises(DatasetError, match="before its last row"):
        dqn.dataset_items(dqn.Params(), ends_early)
    missing_row = {k: np.delete(v, 1) for k, v in STEPS.items()}
    with pytest.raises(DatasetError, match="not whole"):
        dqn.dataset_items(dqn.Params(), missing_row)


# --- an offline run -------------------------------------------------------------------------


def write_cartpole_dataset(directory: Path, vector_steps: int, num_envs: int = 4) -> int:
    """Records a balancing heuristic (push towards the pole's fall, 10% random) on CartPole
    with episodes cut at 60 steps; returns the steps written."""
    obs_space, action_space = env_spaces("CartPole-v1")
    schema = make_schema("CartPole-v1", obs_space, action_space, False, {"test": "bcq"})
    writer = DatasetWriter(directory, 0, num_envs, schema, max_file_mb=0.05)
    env = make_vector_env("CartPole-v1", num_envs, seed=0, max_episode_steps=60)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    writer.open_episodes(np.ones(num_envs, bool))
    for _ in range(vector_steps):
        actions = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
        actions = np.where(rng.random(num_envs) < 0.1, rng.integers(2, size=num_envs), actions)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        writer.add(obs, actions, rewards, terminated, truncated, real_next)
        writer.open_episodes(done)
        obs = next_obs
    env.close()
    writer.close()
    return writer.counters["written_steps"]


def test_batch_dqn_memory_shard_loads_the_dataset_as_n_step_items(tmp_path):
    """Batch DQN: a DQN config with `input.dir` loads; the memory shard fills its table with
    `dqn.dataset_items` of the whole dataset."""
    data = tmp_path / "data"
    written = write_cartpole_dataset(data, 100)
    raw = {
        "algorithm": {"name": "dqn", "n_step": 3},
        "env": {"id": "CartPole-v1"},
        "input": {"dir": str(data)},
        "replay": {"kind": "uniform", "min_size_to_sample": 10},
        "cluster": {"evaluator": 1},
        "stop": {"eval_return_mean": 300},
    }
    cfg = config_lib.from_dict(raw)
    assert cfg.replay.kind == "uniform" and cfg.cluster.actor is None
    spec = dqn.replay_spec(cfg.algorithm.params, *env_spaces("CartPole-v1"))
    table, shards = memory_role.load_dataset(cfg, spec, 0, 1)
    assert table.size == written and shards == len(list_shards(data))
    expected = dqn.dataset_items(cfg.algorithm.params, read_steps(data))
    held = table.state_dict()
    for name in spec:
        np.testing.assert_array_equal(held[f"data/{name}"], expected[name])


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_train_bcq_offline_with_no_actors(tmp_path):
    """`easyrl train configs/cartpole_bcq.yaml` on a small recorded dataset: no actor runs,
    the learner trains from the memory shard's dataset and the evaluator scores it."""
    data = tmp_path / "data"
    written = write_cartpole_dataset(data, 500)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "easyrl.cli", "train", str(CONFIG)]
    for override in (
        f"input.dir={data}",
        f"run.dir={run_dir}",
        "stop.eval_return_mean=null",
        "stop.max_seconds=15",
        "eval.interval_s=0",
        "eval.episodes=2",
        "eval.num_envs=2",
        "replay.min_size_to_sample=100",
        "run.log_interval_s=0.5",
    ):
        command += ["--set", override]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["restarts"]) == {"ps-0", "memory-0", "learner-0", "evaluator-0"}
    memory = summary["servers"]["memory/0"]["counters"]
    assert memory["memory/0/loaded_items"] == written > 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert last["updates"] > 0 and last["env_steps"] == 0
    assert 0 < last["learner/allowed_fraction"] <= 1 and np.isfinite(last["learner/bc_loss"])
    assert any("eval_return_mean" in m for m in metrics)


def test_a_fused_step_applies_the_classifier_s_gradients_too():
    """BCQ is DQN's step over more variables (the classifier's): fused (`fuse_update`, a lone
    learner) it gives the values and optimizer state of `learn` then the learner's apply."""
    spec = bcq.optimizer(bcq.Params())
    separate, fused = build(), build()
    apart = LocalOptimizer(spec, separate.variables)
    together = LocalOptimizer(spec, fused.variables)
    assert fused.fuse_update(together) is False  # the target is synced apart
    for _ in range(3):
        step = separate.learn(BATCH, WEIGHTS)
        assert len(step.grads) == len(separate.variables) and apart.apply(step.grads)
        fused_step = fused.learn(BATCH, WEIGHTS)
        assert bool(fused_step.grads.applied) and together.apply(fused_step.grads)
    for name, variable in fused.variables.items():
        np.testing.assert_allclose(
            variable.numpy(), separate.variables[name].numpy(), rtol=1e-6, atol=1e-7
        )
    assert any(n.startswith("bc/") for n in fused.variables)
    changed = [
        n
        for n, v in fused.variables.items()
        if not np.array_equal(v.numpy(), build().variables[n].numpy())
    ]
    assert any(n.startswith("bc/") for n in changed) and any(n.startswith("q/") for n in changed)
