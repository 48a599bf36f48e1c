"""Recurrent policies: the LSTM core, IMPALA/A3C and PPO with `model.lstm`, their replay
columns, greedy play with state, and the recurrent SavedModel of `easyrl export` (IMPALA's
and R2D2's; R2D2's own tests are in test_r2d2.py)."""

import dataclasses
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl import config as config_lib
from easyrl.algorithms import a3c, ppo, registry
from easyrl.algorithms.agent_parts import RecurrentGreedy, greedy_policy
from easyrl.algorithms.impala import Params, agent_params
from easyrl.algorithms.impala.agent import IMPALA
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.envs.evaluation import play_episodes
from easyrl.envs.stateless import ENV_ID
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models.lstm import LSTMCore
from easyrl.tools.export import EXPORT_INFO, export
from tests.test_tools import make_run, random_values, write_latest

OBS_SPACE = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)


def make_impala(lstm=8, unroll_length=5, seed=0) -> IMPALA:
    model = ModelConfig(hidden=(16,), lstm=lstm, activation="tanh")
    params = agent_params(Params(unroll_length=unroll_length))
    return IMPALA(params, OBS_SPACE, gym.spaces.Discrete(2), model, seed)


def collect(algo: IMPALA, num_envs: int, steps: int, seed=0) -> list[dict]:
    """The unrolls `algo`'s collector cuts from `steps` steps of the stateless CartPole."""
    env = make_vector_env(ENV_ID, num_envs, seed=seed)
    collector = algo.collector(num_envs, seed=seed)
    obs, _ = env.reset(seed=seed)
    unrolls = []
    for _ in range(steps):
        obs_next, reward, terminated, truncated, _ = env.step(collector.act(obs))
        unroll = collector.observe(reward, obs_next, obs_next, terminated, truncated)
        if unroll is not None:
            unrolls.append(unroll)
        obs = obs_next
    env.close()
    return unrolls


def test_the_core_over_a_sequence_is_its_steps_one_by_one_values_and_gradients():
    core = LSTMCore(3, 4, "core", np.random.default_rng(0))
    rng = np.random.default_rng(1)
    xs = tf.constant(rng.normal(size=(6, 2, 3)).astype(np.float32))  # [T, N, in]
    state = tf.constant(rng.normal(size=(2, 8)).astype(np.float32))
    firsts = tf.constant([[0, 0], [0, 1], [0, 0], [1, 0], [0, 0], [0, 0]], tf.float32)
    weights = tf.constant(rng.normal(size=(6, 2, 4)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        together = core.unroll(xs, state, firsts)  # [T, N, U]
        outputs, s = [], state
        for t in range(6):
            h, s = core.step(xs[t], s, firsts[t])
            outputs.append(h)
        one_by_one = tf.stack(outputs)
        loss_together = tf.reduce_sum(together * weights)
        loss_one_by_one = tf.reduce_sum(one_by_one * weights)
    np.testing.assert_allclose(together, one_by_one, atol=1e-6)
    for a, b in zip(
        tape.gradient(loss_together, [core.w, core.b]),
        tape.gradient(loss_one_by_one, [core.w, core.b]),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert float(tf.reduce_max(tf.abs(together))) > 0.01  # not trivially zero


def test_a_first_flag_restarts_the_state_from_zeros():
    core = LSTMCore(3, 4, "core", np.random.default_rng(0))
    x = tf.ones([2, 3])
    carried = tf.fill([2, 8], 0.7)
    h, _ = core.step(x, carried, tf.constant([1.0, 0.0]))
    fresh, _ = core.step(x, tf.zeros([2, 8]), tf.zeros([2]))
    np.testing.assert_allclose(h[0], fresh[0], atol=1e-7)  # reset: as from zeros
    assert np.abs(h[1] - fresh[1]).max() > 1e-3  # carried: differs
    # The state is c then h: h' is the second half of the new state.
    _, new_state = core.step(x, carried, tf.zeros([2]))
    np.testing.assert_allclose(new_state[:, 4:], core.step(x, carried, tf.zeros([2]))[0])


def test_the_learner_recomputes_the_actors_logits_across_unrolls_and_episode_starts():
    algo = make_impala()
    unrolls = collect(algo, num_envs=4, steps=60)  # random-ish CartPole episodes: ~20 steps
    batch = {k: np.concatenate([u[k] for u in unrolls[1:]]) for k in unrolls[0]}
    assert batch["state"].shape == (4 * 11, 16) and batch["first"].shape == (4 * 11, 6)
    assert np.abs(batch["state"]).max() > 1e-3  # unrolls start mid-episode, state carried
    assert batch["first"][:, 1:].sum() >= 4  # episodes start inside unrolls
    assert np.all(unrolls[0]["first"][:, 0] == 1) and np.all(unrolls[0]["state"] == 0)
    # The learner's unroll from the shipped state, at the acting weights, gives the
    # behaviour logits exactly: same state, same resets.
    logits, _ = algo.net.unroll(batch["obs"], batch["state"], batch["first"])
    np.testing.assert_allclose(logits[:, :5], batch["logits"], atol=1e-5)
    step = algo.learn(batch)
    assert step.stats["rho_mean"] == pytest.approx(1.0, abs=1e-5)
    grads = dict(zip(algo.variables, step.grads, strict=True))
    assert np.abs(grads["net/lstm/w"]).max() > 0
    # The state matters: from zeros instead, the logits differ.
    zeros, _ = algo.net.unroll(batch["obs"], np.zeros_like(batch["state"]), batch["first"])
    assert np.abs(zeros[:, :5] - batch["logits"]).max() > 1e-4


def test_a3c_computes_its_gradients_on_recurrent_unrolls():
    model = ModelConfig(hidden=(16,), lstm=8, activation="tanh")
    algo = a3c.build(a3c.Params(unroll_length=5), OBS_SPACE, gym.spaces.Discrete(2), model)
    unroll = collect(algo, num_envs=2, steps=10)[-1]  # type: ignore[arg-type]
    grads = dict(zip(algo.variables, algo.learn(unroll, None).grads, strict=True))
    assert np.abs(grads["net/lstm/w"]).max() > 0


def ppo_round(algo, num_envs: int, rounds: int, seed=0) -> list[dict]:
    """The round batches `algo`'s PPO collector builds in `rounds` rounds on the stateless
    CartPole (the envs go on across rounds, as on an actor)."""
    env = make_vector_env(ENV_ID, num_envs, seed=seed)
    collector = algo.collector(num_envs, seed=seed)
    obs, _ = env.reset(seed=seed)
    batches = []
    for _ in range(rounds):
        collector.start_round(num_envs)  # a recurrent round: one sequence per env
        batch = None
        while batch is None:
            obs_next, reward, terminated, truncated, info = env.step(collector.act(obs))
            real = final_observations(obs_next, info, terminated | truncated)
            batch = collector.observe(reward, obs_next, real, terminated, truncated)
            obs = obs_next
        batches.append(batch)
    env.close()
    return batches


def test_ppo_learns_on_sequences_from_the_states_its_actor_held():
    model = ModelConfig(hidden=(16,), lstm=8, activation="tanh")
    params = ppo.Params(rollout_length=16, minibatch_size=32, num_epochs=2)
    algo = ppo.build(params, OBS_SPACE, gym.spaces.Discrete(2), model, learner=True)
    assert algo.state_size == 32  # policy c, h and value c, h
    first, second = ppo_round(algo, num_envs=4, rounds=2)
    assert np.all(first["state"] == 0) and np.all(first["first"][:, 0] == 1)
    assert np.abs(second["state"]).max() > 1e-3  # the episodes (and states) go on
    assert second["first"].sum() >= 1  # an episode starts inside the round
    spec = ppo.replay_spec(params, OBS_SPACE, gym.spaces.Discrete(2), lstm=8)
    assert {k: v.shape[1:] for k, v in second.items()} == {k: s for k, (s, _) in spec.items()}
    # At the acting weights the learner's unrolls reproduce the actor's log-probs: the first
    # minibatch's ratio is exactly 1 (the later ones follow the updates it is given).
    algo.params = dataclasses.replace(params, num_epochs=1, minibatch_size=64)
    steps = list(algo.learn_round(second, np.random.default_rng(0)))
    assert len(steps) == 1 and steps[0].stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    grads = dict(zip(algo.variables, steps[0].grads, strict=True))
    assert np.abs(grads["pi/lstm/w"]).max() > 0 and np.abs(grads["vf/lstm/w"]).max() > 0
    # Minibatches are whole sequences: 4 sequences of 16 steps in minibatches of 32 steps.
    algo.params = params
    assert len(list(algo.learn_round(second, np.random.default_rng(0)))) == 2 * 2
    with pytest.raises(EasyRLError, match="recurrent state"):
        algo.greedy(np.zeros((1, 2), np.float32))
    env = make_vector_env(ENV_ID, 2, seed=0)
    returns, _ = play_episodes(env, greedy_policy(algo, recurrent=True), 2, seed=0)
    env.close()
    assert len(returns) == 2


def test_recurrent_replay_columns_follow_model_lstm():
    raw = {"algorithm": {"name": "impala", "unroll_length": 5}, "env": {"id": ENV_ID}}
    plain = registry.replay_spec(config_lib.from_dict(raw), OBS_SPACE, gym.spaces.Discrete(2))
    assert "state" not in plain and "first" not in plain
    cfg = config_lib.from_dict({**raw, "model": {"lstm": 8}})
    spec = registry.replay_spec(cfg, OBS_SPACE, gym.spaces.Discrete(2))
    assert spec["state"] == ((16,), np.dtype(np.float32))
    assert spec["first"] == ((6,), np.dtype(np.float32))
    assert {k: v for k, v in spec.items() if k not in ("state", "first")} == plain
    # PPO: a round's item becomes one env's sequence; an actor ships one per env.
    raw = {"algorithm": {"name": "ppo", "rollout_length": 16}, "env": {"id": ENV_ID}}
    cfg = config_lib.from_dict({**raw, "model": {"lstm": 8}})
    spec = registry.replay_spec(cfg, OBS_SPACE, gym.spaces.Discrete(2))
    assert spec["obs"] == ((16, 2), np.dtype(np.float32)) and spec["state"][0] == (32,)
    assert registry.round_share(cfg, 0, 2) == cfg.env.num_envs
    assert registry.round_share(config_lib.from_dict(raw), 0, 2) == 16 * cfg.env.num_envs


def test_model_lstm_is_refused_where_no_recurrent_policy_exists():
    with pytest.raises(ConfigError, match=r"model\.lstm: dqn has no recurrent policy.*impala"):
        config_lib.from_dict({"algorithm": {"name": "dqn"}, "model": {"lstm": 8}})
    with pytest.raises(ConfigError, match=r"model\.lstm: units must be >= 0"):
        config_lib.from_dict({"algorithm": {"name": "impala"}, "model": {"lstm": -1}})


def test_recurrent_greedy_play_restarts_the_state_at_each_episode():
    algo = make_impala(seed=3)
    with pytest.raises(EasyRLError, match="recurrent state"):
        algo.greedy(np.zeros((1, 2), np.float32))
    policy = greedy_policy(algo, recurrent=True)
    assert isinstance(policy, RecurrentGreedy)
    obs = np.random.default_rng(0).normal(size=(5, 2, 2)).astype(np.float32)
    for t in range(3):
        policy(obs[t])
    policy.end_episodes(np.array([True, False]))
    carried = policy._state.copy()
    policy(obs[3])
    # Env 0 started a new episode: its step ran from zeros; env 1 carried its state.
    _, from_zeros = algo.greedy_step(obs[3], np.zeros_like(carried), np.zeros(2))
    _, from_carried = algo.greedy_step(obs[3], carried, np.zeros(2))
    np.testing.assert_allclose(policy._state[0], from_zeros[0], atol=1e-6)
    np.testing.assert_allclose(policy._state[1], from_carried[1], atol=1e-6)
    # play_episodes tells the policy where episodes end, and plays them whole.
    env = make_vector_env(ENV_ID, 2, seed=0)
    returns, lengths = play_episodes(env, greedy_policy(algo, recurrent=True), 3, seed=0)
    env.close()
    assert len(returns) == 3 and all(r == n for r, n in zip(returns, lengths, strict=True))


PLAY_WITH_PLAIN_TF = """
import json, sys
import gymnasium as gym
import numpy as np
import tensorflow as tf

policy = tf.saved_model.load(sys.argv[1])
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=0)
state = policy.signatures["get_initial_state"](batch_size=tf.constant(1))["state"]
actions, done = [], False
while not done:
    limits = np.array([2.4, 12 * 2 * np.pi / 360], np.float32)
    seen = (np.asarray(obs, np.float32)[[0, 2]] / limits)[None]  # no velocities
    out = policy.signatures["action"](obs=tf.constant(seen), state=state)
    state = out["state"]
    actions.append(int(out["action"][0]))
    obs, _, terminated, truncated, _ = env.step(actions[-1])
    done = terminated or truncated
json.dump(actions, open(sys.argv[2], "w"))
"""


@pytest.mark.cluster
@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "impala", "unroll_length": 5},
        {"name": "r2d2", "burn_in": 2, "learn_length": 4, "period": 3},
    ],
    ids=["impala", "r2d2"],
)
def test_an_exported_recurrent_policy_steps_an_episode_with_plain_tensorflow(tmp_path, algorithm):
    raw = {"algorithm": algorithm, "env": {"id": ENV_ID}, "model": {"hidden": [8], "lstm": 4}}
    run_dir, cfg, algo = make_run(tmp_path, "lstm", raw)
    # Random weights whose greedy episode takes both actions (a constant policy would not
    # show that the state travels).
    for seed in range(20):
        values = random_values(algo, seed)
        expected = play_greedy(algo, values)
        if len(set(expected)) == 2:
            break
    write_latest(run_dir, cfg, values)
    out = export(run_dir, tmp_path / "saved")
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["state"] == {"name": "state", "shape": [None, 8], "dtype": "float32"}
    result = tmp_path / "actions.json"
    subprocess.run(
        [sys.executable, "-c", PLAY_WITH_PLAIN_TF, str(out), str(result)],
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        check=True,
        timeout=120,
    )
    # The same episode as easyrl's own greedy policy of the run's weights plays it.
    assert json.loads(result.read_text()) == expected and len(set(expected)) == 2


def play_greedy(algo, values: dict) -> list[int]:
    """The actions of the greedy policy of `values` in one stateless CartPole episode."""
    for name, value in values.items():
        algo.variables[name].assign(value)
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=0)
    policy, actions, done = greedy_policy(algo, recurrent=True), [], False
    while not done:
        actions.append(int(policy(obs[None])[0]))
        obs, _, terminated, truncated, _ = env.step(actions[-1])
        done = terminated or truncated
    return actions
