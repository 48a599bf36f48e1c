"""R2D2: n-step returns cut at the sequence end, value rescaling, overlapping sequences with
the actor's stored state, burn-in, sequence priorities, and a run through real roles."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.algorithms.r2d2 import Params
from easyrl.algorithms.r2d2.agent import R2D2, nstep_returns, rescale, unrescale
from easyrl.config import ModelConfig
from easyrl.envs import make_vector_env
from easyrl.envs.stateless import ENV_ID
from easyrl.errors import ConfigError
from tests.test_cluster import ROOT, _assert_no_processes_left, _counters

OBS_SPACE = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)


def make_r2d2(seed=0, lstm=8, **params) -> R2D2:
    fields = {"burn_in": 2, "learn_length": 6, "period": 4, "n_step": 3, **params}
    model = ModelConfig(hidden=(16,), lstm=lstm, activation="tanh")
    return R2D2(Params(**fields), OBS_SPACE, gym.spaces.Discrete(2), model, seed)


def collect(agent: R2D2, num_envs: int, steps: int, seed=0) -> list[dict]:
    """The sequences `agent`'s collector cuts from `steps` steps of the stateless CartPole
    (epsilon-greedy with the agent's `epsilon`: one actor, no annealing)."""
    env = make_vector_env(ENV_ID, num_envs, seed=seed)
    collector = agent.collector(num_envs)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    sequences = []
    for _ in range(steps):
        actions = collector.act(obs, rng)
        obs_next, reward, terminated, truncated, _ = env.step(actions)
        sequence = collector.observe(reward, obs_next, obs_next, terminated, truncated)
        if sequence is not None:
            sequences.append(sequence)
        obs = obs_next
    env.close()
    return sequences


def reference_returns(reward, discount, bootstrap, n):
    """`nstep_returns` in float64 loops, time-major `[L, B]`."""
    length, batch = reward.shape
    out = np.zeros((length, batch))
    for b in range(batch):
        for t in range(length):
            m, total, factor = min(n, length - t), 0.0, 1.0
            for k in range(m):
                total += factor * reward[t + k, b]
                factor *= discount[t + k, b]
            out[t, b] = total + factor * bootstrap[t + m, b]
    return out


def test_nstep_returns_stop_at_episode_ends_and_at_the_sequence_end():
    rng = np.random.default_rng(0)
    length, batch = 7, 3
    reward = rng.normal(size=(length, batch))
    discount = np.full((length, batch), 0.9)
    discount[2, 0] = discount[5, 1] = 0.0  # episode ends inside the sequences
    bootstrap = rng.normal(size=(length + 1, batch))
    for n in (1, 3, 10):
        got = nstep_returns(*(tf.constant(x, tf.float32) for x in (reward, discount, bootstrap)), n)
        expected = reference_returns(reward, discount, bootstrap, n)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    # The step before an episode end does not reach past it.
    got = nstep_returns(*(tf.constant(x, tf.float32) for x in (reward, discount, bootstrap)), 3)
    assert got.numpy()[2, 0] == pytest.approx(reward[2, 0], abs=1e-6)


def test_value_rescaling_is_inverted_by_its_inverse():
    x = tf.constant(np.linspace(-500.0, 500.0, 101), tf.float32)
    for eps in (1e-3, 1e-2):
        np.testing.assert_allclose(unrescale(rescale(x, eps), eps), x, rtol=1e-4, atol=1e-3)
    assert float(rescale(tf.constant(99.0), 1e-3)) == pytest.approx(9.0 + 0.099, abs=1e-5)


def test_sequences_overlap_and_carry_the_state_the_actor_held():
    agent = make_r2d2(epsilon=0.5)  # T = 8, a new sequence every 4 steps
    sequences = collect(agent, num_envs=3, steps=40)
    assert len(sequences) == 9  # at steps 8, 12, ..., 40
    first = sequences[0]
    assert first["obs"].shape == (3, 9, 2) and first["action"].shape == (3, 8)
    assert first["state"].shape == (3, 16) and first["first"].shape == (3, 9)
    assert np.all(first["state"] == 0) and np.all(first["first"][:, 0] == 1)
    for older, newer in zip(sequences, sequences[1:], strict=False):
        # Adjacent sequences share T - period = 4 steps.
        np.testing.assert_array_equal(older["obs"][:, 4:], newer["obs"][:, :5])
        np.testing.assert_array_equal(older["action"][:, 4:], newer["action"][:, :4])
        np.testing.assert_array_equal(older["first"][:, 4:], newer["first"][:, :5])
    # An episode ends where the discount is 0, and the next observation starts one.
    batch = {k: np.concatenate([s[k] for s in sequences[1:]]) for k in first}
    ends = batch["discount"] == 0
    assert ends.any()
    np.testing.assert_array_equal(ends, batch["first"][:, 1:] == 1)
    # The stored state is the actor's: running the core from it over the steps before the
    # next sequence's start gives that sequence's stored state.
    core = agent.q.core
    assert core is not None
    older, newer = sequences[3], sequences[4]
    h = agent.q.torso(older["obs"][:, :4].reshape(-1, 2))
    h = tf.transpose(tf.reshape(h, [3, 4, -1]), [1, 0, 2])
    _, state = core.run(h, older["state"], older["first"][:, :4].T)
    np.testing.assert_allclose(state.numpy(), newer["state"], atol=1e-5)
    assert np.abs(newer["state"]).max() > 1e-3


def test_the_learner_replays_the_actors_greedy_choices_from_the_stored_state():
    agent = make_r2d2(seed=3, burn_in=0, learn_length=8, epsilon=0.0)
    sequences = collect(agent, num_envs=4, steps=24)
    batch = {k: np.concatenate([s[k] for s in sequences[1:]]) for k in sequences[0]}
    q = agent._unroll(agent.q, batch["obs"], batch["state"], batch["first"])  # [T+1, B, A]
    np.testing.assert_array_equal(np.argmax(q.numpy()[:-1], axis=2).T, batch["action"])
    # From zeros instead of the stored state, the Q values differ.
    zeros = agent._unroll(agent.q, batch["obs"], np.zeros_like(batch["state"]), batch["first"])
    assert np.abs(zeros.numpy() - q.numpy()).max() > 1e-4


def test_burn_in_shapes_the_state_but_gets_no_gradient():
    agent = make_r2d2(seed=1, epsilon=1.0)
    sequences = collect(agent, num_envs=4, steps=24)
    batch = {k: np.concatenate([s[k] for s in sequences[1:]]) for k in sequences[0]}
    args = [tf.constant(batch[k]) for k in ("obs", "action", "reward", "discount", "state")]
    first = tf.constant(batch["first"])
    burn = agent.params.burn_in
    with tf.GradientTape() as tape:
        tape.watch(args[0])
        td, _ = agent._td(agent.target, *args, first)
        loss = tf.reduce_sum(tf.square(td))
    obs_grad = tape.gradient(loss, args[0]).numpy()  # [B, T+1, 2]
    assert np.all(obs_grad[:, :burn] == 0) and np.abs(obs_grad[:, burn:]).max() > 0
    # ...yet the burn-in observations change the learning steps' values through the state.
    changed = batch["obs"].copy()
    changed[:, :burn] += 1.0
    other, _ = agent._td(agent.target, tf.constant(changed), *args[1:], first)
    assert np.abs(other.numpy() - td.numpy()).max() > 1e-5


def test_priorities_mix_the_max_and_the_mean_of_the_sequences_td():
    agent = make_r2d2(seed=2, eta=0.9, epsilon=1.0)
    sequences = collect(agent, num_envs=4, steps=16)
    batch = {k: np.concatenate([s[k] for s in sequences]) for k in sequences[0]}
    weights = np.ones(len(batch["action"]), np.float32)
    columns = [batch[k] for k in ("obs", "action", "reward", "discount", "state", "first")]
    td, _ = agent._td(agent.target, *columns)
    td_abs = np.abs(td.numpy())  # [L, B]
    expected = 0.9 * td_abs.max(0) + 0.1 * td_abs.mean(0)
    step = agent.learn(batch, weights)
    np.testing.assert_allclose(step.priorities, expected, rtol=1e-5)
    # On the actor, with the target network in sync, the initial priorities are the same.
    np.testing.assert_allclose(agent.initial_priorities(batch), expected, rtol=1e-5)
    assert step.stats["loss"] > 0 and all(np.isfinite(g).all() for g in step.grads)
    grads = dict(zip(agent.variables, step.grads, strict=True))
    assert np.abs(grads["q/lstm/w"]).max() > 0


def test_r2d2_config_needs_an_lstm_and_a_period_within_the_sequence():
    with pytest.raises(ConfigError, match=r"model\.lstm: r2d2 needs an LSTM core"):
        config_lib.from_dict({"algorithm": {"name": "r2d2"}, "env": {"id": ENV_ID}})
    with pytest.raises(
        ConfigError,
        match=r"r2d2: period must be in \[1, burn_in \+ learn_length\] = \[1, 6\], got 7",
    ):
        Params(burn_in=2, learn_length=4, period=7)
    cfg = config_lib.from_dict(
        {
            "algorithm": {"name": "r2d2", "burn_in": 2, "learn_length": 4, "period": 3},
            "env": {"id": ENV_ID},
            "model": {"lstm": 8},
        }
    )
    assert cfg.replay.kind == "prioritized"
    spec = registry.replay_spec(cfg, OBS_SPACE, gym.spaces.Discrete(2))
    assert spec["obs"] == ((7, 2), np.dtype(np.float32)) and spec["state"][0] == (16,)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_r2d2_through_real_roles_two_memories(launch):
    """R2D2 on 1 PS, 2 prioritized memory shards, 1 learner, 2 actors: sequences with their
    states reach the learner and its new priorities come back to both shards."""
    run = launch(
        "stop.max_env_steps=8000",
        "stop.max_seconds=90",
        "env.num_envs=4",
        "algorithm.batch_size=8",
        "replay.min_size_to_sample=16",
        "replay.error_buffer=64",  # the actors wait for the learner's samples
        "cluster.memory=2",
        config=ROOT / "configs" / "stateless_cartpole_r2d2.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert all(n == 0 for n in summary["restarts"].values()), summary["restarts"]
    ps0 = _counters(summary, "ps/0")
    assert ps0["learner/0/updates"] > 0 and ps0["ps/0/applied"] > 0, ps0
    for shard in (0, 1):
        memory = _counters(summary, f"memory/{shard}")
        assert memory[f"memory/{shard}/inserts"] > 0, memory
        assert memory[f"memory/{shard}/priority_updates"] > 0, memory
    logs = (run.run_dir / "logs" / "learner-0.log").read_text()
    assert "obs float32[8, 41, 2]" in logs and "state float32[8, 128]" in logs, logs
    assert "first float32[8, 41]" in logs
    _assert_no_processes_left(run.run_dir)
