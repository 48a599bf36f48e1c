"""Tests of easyrl.algorithms.es: centered ranks, noise, the ES gradient against hand
computation, an ES optimisation of a quadratic, the batched per-env forward against a float64
numpy forward, the collector's bookkeeping, and collector rounds on CartPole and Pendulum."""

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from easyrl.algorithms import es
from easyrl.algorithms.es import Params, centered_ranks, es_gradient, noise, round_share
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import ConfigError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
MODEL = ModelConfig(hidden=(5, 4), activation="tanh")


def build(action_space=ACTION_SPACE, **changes):
    return es.build(Params(**changes), OBS_SPACE, action_space, MODEL, seed=3)


def randomize(algo, seed: int = 0) -> np.ndarray:
    """Sets every variable to N(0, 0.5) values; returns the flat theta (order of variables)."""
    rng = np.random.default_rng(seed)
    for var in algo.variables.values():
        var.assign((0.5 * rng.standard_normal(var.shape)).astype(np.float32))
    return np.concatenate([v.numpy().ravel() for v in algo.variables.values()])


def unflatten(algo, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Splits a flat vector by the variables' names and shapes, in float64."""
    out, start = {}, 0
    for name, var in algo.variables.items():
        size = int(np.prod(var.shape))
        out[name] = flat[start : start + size].astype(np.float64).reshape(var.shape)
        start += size
    assert start == flat.size
    return out


def numpy_outputs(algo, obs: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Independent float64 forward of one parameter vector: tanh hidden layers, linear head."""
    p = unflatten(algo, flat)
    h = np.tanh(obs.astype(np.float64) @ p["policy/0/w"] + p["policy/0/b"])
    h = np.tanh(h @ p["policy/1/w"] + p["policy/1/b"])
    return h @ p["policy/out/w"] + p["policy/out/b"]


# --- the numpy pieces ------------------------------------------------------------------


def test_centered_ranks_without_ties_match_openai():
    x = np.array([[3.0, -1.0, 7.0], [0.5, 10.0, 2.0]])
    # sorted: -1 < 0.5 < 2 < 3 < 7 < 10 -> ranks [[3, 0, 4], [1, 5, 2]]; rank / 5 - 0.5.
    expected = np.array([[0.1, -0.5, 0.3], [-0.3, 0.5, -0.1]], np.float32)
    out = centered_ranks(x)
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_allclose(out, expected, atol=1e-7)
    # OpenAI's compute_centered_ranks, written out (argsort ranks).
    ranks = np.empty(x.size)
    ranks[x.ravel().argsort()] = np.arange(x.size)
    np.testing.assert_allclose(out.ravel(), ranks / (x.size - 1) - 0.5, atol=1e-7)


def test_centered_ranks_average_ties():
    # Ties share the mean of the ranks they span: 1,1 -> ranks 0,1 -> 0.5 each;
    # 5,5,5 -> ranks 3,4,5 -> 4 each; 2 -> rank 2. n = 6, so rank / 5 - 0.5.
    out = centered_ranks(np.array([5.0, 1.0, 5.0, 2.0, 1.0, 5.0]))
    np.testing.assert_allclose(out, [0.3, -0.4, 0.3, -0.1, -0.4, 0.3], atol=1e-7)
    np.testing.assert_array_equal(centered_ranks(np.full(4, 7.0)), np.zeros(4))
    np.testing.assert_array_equal(centered_ranks(np.array([3.0])), [0.0])


def test_centered_ranks_range():
    out = centered_ranks(np.random.default_rng(0).standard_normal((7, 9)))
    assert out.min() == pytest.approx(-0.5) and out.max() == pytest.approx(0.5)
    assert out.sum() == pytest.approx(0.0, abs=1e-5)


def test_noise_is_reproducible_per_seed():
    first, again, other = noise(123, 1000), noise(123, 1000), noise(124, 1000)
    assert first.dtype == np.float32 and first.shape == (1000,)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    np.testing.assert_array_equal(
        first, np.random.default_rng(123).standard_normal(1000).astype(np.float32)
    )
    assert abs(first.mean()) < 0.15 and first.std() == pytest.approx(1.0, abs=0.1)


def test_es_gradient_by_hand():
    theta = np.array([1.0, -2.0, 0.5], np.float32)
    sigma, decay = 0.1, 0.01
    # Returns [r+0, r+1, r-0, r-1] = [1, 4, 3, 2] -> ranks [0, 3, 2, 1] -> /3 - 0.5 =
    # [-1/2, 1/2, 1/6, -1/6]; pair weights r+ - r- = [-2/3, 2/3].
    # g = -(1 / (2 sigma)) (-2/3 eps0 + 2/3 eps1) + decay theta = (eps0 - eps1) / (3 sigma) + ...
    eps0 = np.random.default_rng(5).standard_normal(3)
    eps1 = np.random.default_rng(7).standard_normal(3)
    expected = (eps0 - eps1) / (3 * sigma) + decay * theta
    grad = es_gradient(theta, [5, 7], [1.0, 4.0], [3.0, 2.0], sigma, decay)
    assert grad.dtype == np.float32 and grad.shape == (3,)
    np.testing.assert_allclose(grad, expected, rtol=1e-5)
    # All returns tied: only the weight decay is left.
    tied = es_gradient(theta, [5, 7], [2.0, 2.0], [2.0, 2.0], sigma, decay)
    np.testing.assert_allclose(tied, decay * theta, rtol=1e-6)


@pytest.mark.parametrize(
    "seeds, pos, neg",
    [([], [], []), ([1, 2], [1.0], [1.0, 2.0]), ([1], [np.nan], [0.0])],
    ids=["empty", "lengths", "nan"],
)
def test_es_gradient_rejects_bad_rounds(seeds, pos, neg):
    with pytest.raises(ValueError):
        es_gradient(np.zeros(3, np.float32), seeds, pos, neg, 0.1, 0.0)


def test_es_with_adam_climbs_a_quadratic():
    """f(theta) = -|theta - theta*|^2 as the return; 40 rounds of 16 pairs with numpy Adam."""
    rng = np.random.default_rng(0)
    size, sigma, lr = 10, 0.05, 0.05
    target = rng.standard_normal(size)
    theta = np.zeros(size, np.float32)
    m, v = np.zeros(size), np.zeros(size)
    start = np.linalg.norm(theta - target)
    for t in range(1, 41):
        seeds = rng.integers(0, 2**31, size=16)
        eps = np.stack([noise(s, size) for s in seeds])  # [n, P]
        pos = -np.sum((theta + sigma * eps - target) ** 2, axis=1)
        neg = -np.sum((theta - sigma * eps - target) ** 2, axis=1)
        grad = es_gradient(theta, seeds, pos, neg, sigma, 0.0)
        if t == 1:  # a descent direction of |theta - theta*|^2
            assert np.dot(grad, theta - target) > 0
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        step = lr * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-8)
        theta = (theta - step).astype(np.float32)
    assert np.linalg.norm(theta - target) < 0.2 * start


@pytest.mark.parametrize(
    "population, num_actors, shares",
    [
        (32, 1, [32]),
        (10, 3, [4, 3, 3]),
        (7, 7, [1] * 7),
        (2, 4, [1, 1, 0, 0]),
        (9, 4, [3, 2, 2, 2]),
    ],
)
def test_round_share_splits_the_population(population, num_actors, shares):
    params = Params(population=population)
    got = [round_share(params, 8, i, num_actors) for i in range(num_actors)]
    assert got == shares and sum(got) == population


def test_round_share_rejects_bad_indices():
    with pytest.raises(ValueError):
        round_share(Params(), 8, 3, 3)
    with pytest.raises(ValueError):
        round_share(Params(), 8, 0, 0)


@pytest.mark.parametrize(
    "changes",
    [{"sigma": 0.0}, {"population": 0}, {"episodes_per_perturbation": 0}, {"weight_decay": -1.0}],
)
def test_params_are_checked(changes):
    with pytest.raises(ConfigError, match=next(iter(changes))):
        Params(**changes)


def test_small_interface_functions():
    params = Params(
        optimizer="sgd", lr=0.1, lr_schedule="step", lr_step_factor=0.5, lr_step_period=9
    )
    assert es.optimizer(params) == OptimizerSpec(kind="sgd", lr=0.1, decay_rate=0.5, decay_steps=9)
    assert es.replay_spec(params, OBS_SPACE, ACTION_SPACE) == {
        "seed": ((), np.dtype(np.int64)),
        "return_pos": ((), np.dtype(np.float32)),
        "return_neg": ((), np.dtype(np.float32)),
        "steps": ((), np.dtype(np.int64)),
    }


# --- the TF agent ----------------------------------------------------------------------


def test_variables_are_named_and_deterministic():
    algo, same, other = build(), build(), es.build(Params(), OBS_SPACE, ACTION_SPACE, MODEL, 4)
    assert algo.flow == "sync_rounds"
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "policy/0/b": (5,),
        "policy/0/w": (4, 5),
        "policy/1/b": (4,),
        "policy/1/w": (5, 4),
        "policy/out/b": (3,),
        "policy/out/w": (4, 3),
    }
    for name in algo.variables:
        np.testing.assert_array_equal(algo.variables[name], same.variables[name])
    assert not np.array_equal(algo.variables["policy/0/w"], other.variables["policy/0/w"])


@pytest.mark.parametrize(
    "obs_space, action_space, model, match",
    [
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), ACTION_SPACE, MODEL, "flat Box obs"),
        (OBS_SPACE, gym.spaces.MultiDiscrete([2, 2]), MODEL, "Discrete or flat Box"),
        (OBS_SPACE, gym.spaces.Box(-1.0, 1.0, (2, 2)), MODEL, "Discrete or flat Box"),
        (OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, (2,)), MODEL, "finite Box action"),
        (OBS_SPACE, ACTION_SPACE, SimpleNamespace(kind="cnn"), "mlp"),
    ],
    ids=["image", "multidiscrete", "matrix-action", "unbounded", "cnn"],
)
def test_build_refuses_unsupported_setups(obs_space, action_space, model, match):
    with pytest.raises(ConfigError, match=match):
        es.build(Params(), obs_space, action_space, model)


def test_batched_forward_equals_separate_forwards():
    algo = build(sigma=0.3)
    theta = randomize(algo)
    obs = np.random.default_rng(1).uniform(-2, 2, size=(3, 4)).astype(np.float32)
    signs = [1.0, -1.0, 1.0]
    rows = np.stack(
        [
            theta + np.float32(s * 0.3) * noise(k, theta.size)
            for k, s in zip([11, 11, 42], signs, strict=True)
        ]
    )  # [3, P]
    expected = np.stack([numpy_outputs(algo, obs[i : i + 1], rows[i])[0] for i in range(3)])
    np.testing.assert_allclose(algo.forward(obs, rows), expected, rtol=1e-5, atol=1e-6)
    # The three envs really run different policies.
    assert not np.allclose(expected[0], numpy_outputs(algo, obs[:1], theta)[0], atol=1e-3)
    # Greedy is the unperturbed theta.
    np.testing.assert_array_equal(
        algo.greedy(obs), np.argmax(numpy_outputs(algo, obs, theta), axis=1)
    )


def test_collector_acts_with_each_envs_parameters():
    algo = build(sigma=0.3)
    theta = randomize(algo, seed=2)
    collector = algo.collector(num_envs=4, seed=0)
    collector.start_round(1)  # one pair, one episode per sign: envs 2 and 3 run theta
    (seed,) = collector.seeds
    eps = noise(seed, theta.size)
    rows = collector.env_parameters()
    np.testing.assert_allclose(rows[0], theta + np.float32(0.3) * eps, rtol=1e-6)
    np.testing.assert_allclose(rows[1], theta - np.float32(0.3) * eps, rtol=1e-6)
    np.testing.assert_array_equal(rows[2:], np.stack([theta, theta]))
    obs = np.random.default_rng(3).uniform(-2, 2, size=(4, 4)).astype(np.float32)
    actions = collector.act(obs, np.random.default_rng(0))
    expected = [np.argmax(numpy_outputs(algo, obs[i : i + 1], rows[i])[0]) for i in range(4)]
    np.testing.assert_array_equal(actions, expected)
    collector.act(obs, np.random.default_rng(0))
    assert collector._act.experimental_get_tracing_count() == 1


def test_collector_bookkeeping_by_hand():
    """2 envs, 1 pair, 2 episodes per sign: evaluations (+, -, +, -) handed out in order."""
    algo = build(episodes_per_perturbation=2)
    theta = algo.flat.read().numpy()
    collector = algo.collector(num_envs=2, seed=5)
    obs = np.zeros((2, 4), np.float32)
    no, yes = False, True

    def step(rewards, done):
        return collector.observe(np.array(rewards), obs, obs, np.array(done), np.zeros(2, bool))

    assert step([1.0, 1.0], [yes, yes]) is None  # no round yet: ignored
    collector.start_round(1)
    eps = np.float32(algo.params.sigma) * noise(collector.seeds[0], theta.size)
    assert step([1.0, 10.0], [no, no]) is None
    assert step([2.0, 20.0], [yes, no]) is None  # env 0: (+) return 3 in 2 steps; takes 2nd +
    np.testing.assert_allclose(collector.env_parameters()[0], theta + eps, rtol=1e-6)
    assert step([4.0, 40.0], [no, yes]) is None  # env 1: (-) return 70 in 3 steps; takes 2nd -
    np.testing.assert_allclose(collector.env_parameters()[1], theta - eps, rtol=1e-6)
    batch = step([8.0, 80.0], [yes, yes])  # (+) 4 + 8 in 2 steps, (-) 80 in 1 step
    assert batch["seed"].tolist() == collector.seeds.tolist()
    assert batch["seed"].dtype == np.int64 and batch["steps"].dtype == np.int64
    assert batch["return_pos"].dtype == np.float32 and batch["return_neg"].dtype == np.float32
    np.testing.assert_allclose(batch["return_pos"], [(3.0 + 12.0) / 2])
    np.testing.assert_allclose(batch["return_neg"], [(70.0 + 80.0) / 2])
    assert batch["steps"].tolist() == [2 + 3 + 2 + 1]
    np.testing.assert_array_equal(collector.env_parameters(), np.stack([theta, theta]))
    assert step([1.0, 1.0], [yes, yes]) is None  # round over until the next start_round


def test_idle_envs_are_discarded_and_an_empty_share_finishes_at_once():
    algo = build()
    collector = algo.collector(num_envs=3, seed=0)
    obs = np.zeros((3, 4), np.float32)
    not_done = np.zeros(3, bool)
    collector.start_round(1)
    idle_done = np.array([False, False, True])
    assert collector.observe(np.full(3, 5.0), obs, obs, idle_done, not_done) is None
    batch = collector.observe(np.ones(3), obs, obs, np.array([True, True, True]), not_done)
    np.testing.assert_allclose(batch["return_pos"], [6.0])
    np.testing.assert_allclose(batch["return_neg"], [6.0])
    assert batch["steps"].tolist() == [4]
    collector.start_round(0)
    empty = collector.observe(np.ones(3), obs, obs, not_done, not_done)
    assert {k: v.shape for k, v in empty.items()} == {
        k: (0,) for k in es.replay_spec(Params(), OBS_SPACE, ACTION_SPACE)
    }


def run_round(env, collector, share: int, max_steps: int = 1000) -> dict:
    """Steps `env` with `collector` until it returns the round's batch."""
    assert collector.resets_envs
    obs, _ = env.reset(seed=0)
    collector.start_round(share)
    rng = np.random.default_rng(0)
    for _ in range(max_steps):
        actions = collector.act(obs, rng)
        assert env.action_space.contains(actions.astype(env.action_space.dtype))
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        real_next = final_observations(next_obs, infos, terminated | truncated)
        batch = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        if batch is not None:
            return batch
        obs = next_obs
    raise AssertionError("the round did not finish")


def test_cartpole_round_and_learner_gradient():
    env = make_vector_env("CartPole-v1", 4, vector="sync", seed=0, max_episode_steps=30)
    algo = es.build(
        Params(episodes_per_perturbation=2),
        env.single_observation_space,
        env.single_action_space,
        ModelConfig(hidden=(8,)),
        seed=0,
    )
    try:
        batch = run_round(env, algo.collector(4, seed=1), share=3)
    finally:
        env.close()
    assert {k: v.shape for k, v in batch.items()} == {k: (3,) for k in batch}
    assert len(set(batch["seed"].tolist())) == 3
    for key in ("return_pos", "return_neg"):
        # One reward per step: a return is an episode length, 1..30; a mean of two is k / 2.
        assert ((batch[key] >= 1) & (batch[key] <= 30)).all()
        np.testing.assert_array_equal(2 * batch[key], np.round(2 * batch[key]))
    # Steps of a pair = sum of its 4 episode lengths = 2 * (mean+ + mean-).
    np.testing.assert_array_equal(batch["steps"], 2 * (batch["return_pos"] + batch["return_neg"]))

    updates = list(algo.learn_round(batch, np.random.default_rng(0)))
    assert len(updates) == 1
    grads, stats, _ = updates[0]
    assert [g.shape for g in grads] == [tuple(v.shape) for v in algo.variables.values()]
    assert all(np.isfinite(g).all() for g in grads)
    theta = algo.flat.read().numpy()
    expected = es_gradient(
        theta, batch["seed"], batch["return_pos"], batch["return_neg"], 0.02, 0.005
    )
    np.testing.assert_array_equal(np.concatenate([g.ravel() for g in grads]), expected)
    assert stats["return_max"] <= 30 and stats["env_steps"] == batch["steps"].sum()
    assert stats["grad_norm"] == pytest.approx(np.linalg.norm(expected), rel=1e-5)


def test_pendulum_round_smoke():
    env = make_vector_env("Pendulum-v1", 3, vector="sync", seed=0, max_episode_steps=20)
    algo = es.build(Params(), env.single_observation_space, env.single_action_space, MODEL, seed=0)
    try:
        collector = algo.collector(3, seed=2)
        batch = run_round(env, collector, share=2)
        actions = collector.act(np.zeros((3, 3), np.float32), np.random.default_rng(0))
    finally:
        env.close()
    assert actions.shape == (3, 1) and actions.dtype == np.float32
    assert (np.abs(actions) <= 2.0).all()
    assert batch["steps"].tolist() == [40, 40]  # Pendulum only truncates
    assert (batch["return_pos"] < 0).all() and (batch["return_neg"] < 0).all()
    grads, _, _ = next(algo.learn_round(batch, np.random.default_rng(0)))
    assert all(np.isfinite(g).all() for g in grads)
    greedy = algo.greedy(np.zeros((2, 3), np.float32))
    assert greedy.shape == (2, 1) and (np.abs(greedy) <= 2.0).all()
