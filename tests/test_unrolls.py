"""The shared recurrent machinery of the actors: the unroll accumulator (against a plain
list-of-steps reference on random episodes with resets), the Gumbel-max sampler, and the
IMPALA, PPO and R2D2 collectors built on them (against reference loops written with the
agents' own compiled steps)."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl.algorithms import ppo, r2d2
from easyrl.algorithms.dqn import actor_epsilon
from easyrl.algorithms.dqn.agent import epsilon_greedy
from easyrl.algorithms.impala import Params, agent_params
from easyrl.algorithms.impala.agent import IMPALA
from easyrl.algorithms.masking import ILLEGAL
from easyrl.algorithms.ppo.agent import PPO
from easyrl.algorithms.r2d2.agent import R2D2
from easyrl.algorithms.sampling import gumbel_max, gumbel_noise
from easyrl.algorithms.unrolls import UnrollAccumulator
from easyrl.config import ModelConfig
from easyrl.envs import make_vector_env
from easyrl.envs.stateless import ENV_ID
from easyrl.errors import EasyRLError

OBS_SPACE = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)
MODEL = ModelConfig(hidden=(16,), lstm=8, activation="tanh")


class ReferenceSteps:
    """What the accumulator must give, written plainly: every step in a list, an unroll the
    slice of the last T steps, the state before an unroll its first step's state."""

    def __init__(self, num_envs: int, state_size: int):
        self.state = np.zeros((num_envs, state_size), np.float32)
        self.first = np.ones(num_envs, np.float32)
        self.steps: list[dict] = []

    def step(self, next_state, values: dict, done) -> None:
        self.steps.append({"state": self.state, "first": self.first, **values})
        self.state, self.first = next_state, done.astype(np.float32)

    def unroll(self, length: int, bootstrap) -> dict:
        last = self.steps[-length:]
        out = {k: np.stack([s[k] for s in last], axis=1) for k in last[0] if k != "state"}
        out["obs"] = np.concatenate([out["obs"], bootstrap[:, None]], axis=1)
        out["first"] = np.concatenate([out["first"], self.first[:, None]], axis=1)
        out["state"] = last[0]["state"]
        return out


@pytest.mark.parametrize(
    ("num_envs", "length", "period", "state_size"),
    [(1, 1, 1, 2), (3, 5, 5, 4), (4, 6, 2, 3), (2, 7, 3, 0), (5, 4, 1, 6)],
)
def test_the_accumulator_cuts_what_a_list_of_steps_gives(num_envs, length, period, state_size):
    rng = np.random.default_rng(length * 10 + period)
    columns = {"obs": ((3,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}
    steps = UnrollAccumulator(num_envs, length, columns, state_size, period)
    reference = ReferenceSteps(num_envs, state_size)
    unrolls = 0
    for i in range(60):
        if i == 37:  # a dropped partial unroll: the next one starts afresh, episodes go on
            steps.clear()
            reference.steps.clear()
        np.testing.assert_array_equal(steps.state, reference.state)  # what the policy gets
        np.testing.assert_array_equal(steps.first, reference.first)
        obs = rng.normal(size=(num_envs, 3)).astype(np.float32)
        action = rng.integers(0, 4, num_envs)
        next_state = rng.normal(size=(num_envs, state_size)).astype(np.float32)
        steps.record_act(next_state, obs=obs, action=action)
        reward = rng.normal(size=num_envs).astype(np.float32)
        done = rng.random(num_envs) < 0.3
        reference.step(next_state, {"obs": obs, "action": action, "reward": reward}, done)
        complete = steps.record_outcome(done, reward=reward)
        n = len(reference.steps)
        assert complete == (n >= length and (n - length) % period == 0)
        if not complete:
            continue
        unrolls += 1
        bootstrap = rng.normal(size=(num_envs, 3)).astype(np.float32)
        expected = reference.unroll(length, bootstrap)
        got = {
            "obs": steps.batch_major("obs", bootstrap=bootstrap),
            "action": steps.batch_major("action"),
            "reward": steps.batch_major("reward"),
            **steps.recurrent(bootstrap=True),
        }
        assert got.keys() == expected.keys()
        for name, value in got.items():
            np.testing.assert_array_equal(value, expected[name], err_msg=name)
            assert value.dtype == expected[name].dtype and value.flags.c_contiguous
        np.testing.assert_array_equal(steps.time_major("action"), expected["action"].T)
        first = steps.recurrent(bootstrap=False)["first"]
        np.testing.assert_array_equal(first, expected["first"][:, :length])
    assert unrolls >= 60 // length - 1


def test_an_unroll_is_a_copy_the_next_steps_leave_alone():
    steps = UnrollAccumulator(2, 2, {"obs": ((1,), np.float32)}, state_size=1)
    for i in range(2):
        steps.record_act(np.full((2, 1), i + 1.0, np.float32), obs=np.full((2, 1), i))
        steps.record_outcome(np.zeros(2, bool))
    obs, recurrent = steps.batch_major("obs"), steps.recurrent(bootstrap=True)
    time_major = steps.time_major("obs")
    for _ in range(2):
        steps.record_act(np.full((2, 1), 9.0, np.float32), obs=np.full((2, 1), 7.0))
        steps.record_outcome(np.ones(2, bool))
    np.testing.assert_array_equal(obs[:, :, 0], [[0, 1], [0, 1]])
    np.testing.assert_array_equal(time_major[:, :, 0], [[0, 0], [1, 1]])
    np.testing.assert_array_equal(recurrent["state"], np.zeros((2, 1)))
    np.testing.assert_array_equal(recurrent["first"], [[1, 0, 0], [1, 0, 0]])


def test_the_accumulator_checks_its_arguments_and_the_protocol():
    with pytest.raises(EasyRLError, match="num_envs must be positive"):
        UnrollAccumulator(0, 3, {})
    with pytest.raises(EasyRLError, match="length must be positive"):
        UnrollAccumulator(1, 0, {})
    with pytest.raises(EasyRLError, match=r"period must be in \[1, 3\], got 4"):
        UnrollAccumulator(1, 3, {}, period=4)
    steps = UnrollAccumulator(1, 3, {})
    with pytest.raises(EasyRLError, match="observe called without a preceding act"):
        steps.expect_observe()
    steps.expect_act()
    steps.record_act()
    with pytest.raises(EasyRLError, match="act called twice without observe"):
        steps.expect_act()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gumbel_max_is_the_argmax_of_logits_plus_noise_in_the_noise_precision(dtype):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 4)).astype(np.float32)
    noise = gumbel_noise(np.random.default_rng(1), (500, 4), dtype)
    assert noise.dtype == dtype
    np.testing.assert_array_equal(noise, rng_gumbel(1, (500, 4)).astype(dtype))
    expected = np.argmax(logits.astype(dtype) + noise, axis=1)
    np.testing.assert_array_equal(gumbel_max(tf.constant(logits), tf.constant(noise)), expected)


def rng_gumbel(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).gumbel(size=shape)


def test_gumbel_max_samples_the_softmax_and_never_an_illegal_action():
    logits = np.array([[1.0, ILLEGAL, 0.0, ILLEGAL]], np.float32).repeat(20000, axis=0)
    noise = gumbel_noise(np.random.default_rng(2), logits.shape, np.float32)
    actions = gumbel_max(tf.constant(logits), tf.constant(noise)).numpy()
    counts = np.bincount(actions, minlength=4) / len(actions)
    assert counts[1] == 0 and counts[3] == 0
    assert counts[0] == pytest.approx(np.e / (np.e + 1.0), abs=0.015)


def drive(collector, num_envs: int, steps: int, reference_step, seed=0) -> None:
    """Steps the stateless CartPole with `collector`; before each step, `reference_step(obs)`
    gives the actions a plain loop takes; after it, `reference_step.observe(...)` gives the
    item a plain loop emits, compared with the collector's."""
    env = make_vector_env(ENV_ID, num_envs, seed=seed)
    obs, _ = env.reset(seed=seed)
    items = 0
    for _ in range(steps):
        expected_action = reference_step(obs)
        action = collector.act(obs, np.random.default_rng(reference_step.draws))
        np.testing.assert_array_equal(action, expected_action)
        obs_next, reward, terminated, truncated, _ = env.step(action)
        item = collector.observe(reward, obs_next, obs_next, terminated, truncated)
        expected = reference_step.observe(reward, obs_next, terminated | truncated)
        assert (item is None) == (expected is None)
        if item is not None:
            items += 1
            for name, value in expected.items():
                np.testing.assert_allclose(item[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        obs = obs_next
    env.close()
    assert items >= 2


class ReferenceLoop:
    """A plain recurrent actor: the state per env from zeros, reset where an episode
    starts; `act(obs, state, first, rng)` -> (actions, {column: value}, next state)."""

    def __init__(self, num_envs, state_size, length, period, act):
        self.steps = ReferenceSteps(num_envs, state_size)
        self.length, self.period, self.act = length, period, act
        self.draws = 0  # each step's rng seed, so that collector and reference draw alike
        self.pending: tuple = ()

    def __call__(self, obs):
        self.draws += 1
        rng = np.random.default_rng(self.draws)
        action, values, state = self.act(obs, self.steps.state, self.steps.first, rng)
        self.pending = (state, {"obs": obs, "action": action, **values})
        return action

    def observe(self, reward, next_obs, done):
        state, values = self.pending
        self.steps.step(state, {**values, "reward": reward.astype(np.float32)}, done)
        n = len(self.steps.steps)
        if n < self.length or (n - self.length) % self.period:
            return None
        return self.steps.unroll(self.length, next_obs)


def test_the_impala_collector_is_a_plain_recurrent_sampling_loop():
    algo = IMPALA(agent_params(Params(unroll_length=5)), OBS_SPACE, gym.spaces.Discrete(2), MODEL)

    def act(obs, state, first, rng):
        logits, _, state = algo.net.step(obs, state, first)
        action = np.argmax(logits.numpy() + rng.gumbel(size=logits.shape), axis=1)
        return action, {"logits": logits.numpy()}, state.numpy()

    reference = ReferenceLoop(3, algo.state_size, 5, 5, act)
    reference.observe = with_discount(reference.observe, algo.params.gamma)
    drive(algo.collector(3), 3, 40, reference)


def test_the_ppo_collector_keeps_the_states_and_starts_of_a_plain_loop():
    algo = PPO(ppo.Params(rollout_length=6), OBS_SPACE, gym.spaces.Discrete(2), MODEL)
    half = algo.state_size // 2

    def act(obs, state, first, rng):
        logits, pi_state = algo.pi.step(obs, state[:, :half], first)
        value, vf_state = algo.vf.step(obs, state[:, half:], first)
        noise = rng.gumbel(size=logits.shape).astype(np.float32)
        action = np.argmax(logits.numpy() + noise, axis=1)
        logp = tf.nn.log_softmax(logits).numpy()[np.arange(len(action)), action]
        state = np.concatenate([pi_state.numpy(), vf_state.numpy()], axis=1)
        return action, {"logp": logp, "value": value.numpy()}, state

    reference = ReferenceLoop(3, algo.state_size, 6, 6, act)
    reference.observe = round_of(reference.observe)
    drive(algo.collector(3), 3, 40, reference)


def round_of(observe):
    """PPO's round batch holds the steps without the bootstrap observation and flag."""

    def round_observe(reward, next_obs, done):
        item = observe(reward, next_obs, done)
        if item is None:
            return None
        del item["reward"]  # PPO ships advantages instead
        return {**item, "obs": item["obs"][:, :-1], "first": item["first"][:, :-1]}

    return round_observe


def test_the_r2d2_collector_is_a_plain_epsilon_greedy_loop_of_overlapping_sequences():
    params = r2d2.Params(burn_in=2, learn_length=4, period=2, epsilon=0.3)
    agent = R2D2(params, OBS_SPACE, gym.spaces.Discrete(2), MODEL, seed=1)
    core = agent.q.core
    assert core is not None
    env_steps = [0]

    def act(obs, state, first, rng):
        h, state = core.step(agent.q.torso(obs), state, first)
        greedy = np.argmax(agent.q.heads(h).numpy()[:, :, 0], axis=1)
        epsilon = actor_epsilon(params, 0, 1, env_steps[0])
        env_steps[0] += len(obs)
        action, _ = epsilon_greedy(greedy, epsilon, 2, rng)
        return action, {}, state.numpy()

    reference = ReferenceLoop(3, agent.state_size, 6, 2, act)
    reference.observe = with_discount(reference.observe, params.gamma)
    drive(agent.collector(3, 0, 0, 1), 3, 40, reference)


def with_discount(observe, gamma: float):
    """IMPALA's and R2D2's items hold discounts: gamma, 0 where an episode ends (and the
    next step starts one)."""

    def observe_with_discount(reward, next_obs, done):
        item = observe(reward, next_obs, done)
        if item is not None:
            item["discount"] = (gamma * (1.0 - item["first"][:, 1:])).astype(np.float32)
        return item

    return observe_with_discount
