"""Tests of DQN's Rainbow switches (easyrl.algorithms.dqn): C51's projection against a float64
numpy reference of the paper's algorithm, the distributional loss and priorities, and the
NoisyNet heads."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl import config as config_lib
from easyrl.algorithms import bcq, dqn
from easyrl.algorithms.dqn.agent import NoisyDense, categorical_projection
from easyrl.config import ModelConfig
from easyrl.errors import ConfigError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)
ACTIONS = gym.spaces.Discrete(3)
MODEL = ModelConfig(hidden=(16,), activation="tanh")


def projection_reference(reward, discount, probs, support) -> np.ndarray:
    """Algorithm 1 of Bellemare et al. (2017), in float64, one atom at a time: Tz clipped
    to the support, b = (Tz - v_min) / dz, mass p * (u - b) to atom l = floor(b) and
    p * (b - l) to u = ceil(b) (all of it to l when b lands on an atom)."""
    support = np.asarray(support, np.float64)
    v_min, v_max, dz = support[0], support[-1], support[1] - support[0]
    out = np.zeros((len(reward), len(support)))
    for row in range(len(reward)):
        for i, z in enumerate(support):
            tz = min(max(reward[row] + discount[row] * z, v_min), v_max)
            b = (tz - v_min) / dz
            low, up = int(np.floor(b)), int(np.ceil(b))
            if low == up:
                out[row, low] += probs[row, i]
            else:
                out[row, low] += probs[row, i] * (up - b)
                out[row, up] += probs[row, i] * (b - low)
    return out


@pytest.mark.parametrize("v_min, v_max, atoms", [(-10.0, 10.0, 51), (0.0, 100.0, 11), (-1, 2, 2)])
def test_categorical_projection_matches_the_papers_algorithm(v_min, v_max, atoms):
    rng = np.random.default_rng(atoms)
    support = np.linspace(v_min, v_max, atoms)
    n = 64
    probs = rng.dirichlet(np.ones(atoms), size=n)  # float64
    reward = rng.uniform(2 * v_min - 1, 2 * v_max + 1, size=n)  # some shift off the support
    reward[:8] = support[rng.integers(atoms, size=8)]  # some land on atoms exactly
    discount = rng.choice([0.0, 0.99, 0.9**3, 1.0], size=n)  # 0: terminal
    expected = projection_reference(reward, discount, probs, support)
    got = categorical_projection(
        tf.constant(reward, tf.float32),
        tf.constant(discount, tf.float32),
        tf.constant(probs, tf.float32),
        tf.constant(support, tf.float32),
    ).numpy()
    np.testing.assert_allclose(got, expected, atol=2e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)
    assert expected[discount == 0.0].max(axis=1).min() > 0.49  # terminal: mass on <= 2 atoms


def build(**changes) -> dqn.agent.DQN:
    params = dqn.Params(grad_clip=0.0, **changes)
    return dqn.build(params, OBS_SPACE, ACTIONS, MODEL, seed=1)


def transitions(n: int, rng: np.random.Generator) -> dict:
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(3, size=n),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], size=n).astype(np.float32),
    }


def test_c51_q_values_loss_and_priorities():
    algo = build(num_atoms=21, v_min=-5.0, v_max=5.0)
    rng = np.random.default_rng(0)
    batch = transitions(32, rng)
    logits = algo.q.logits(batch["obs"]).numpy()  # [B, A, N]
    assert logits.shape == (32, 3, 21)
    probs = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    expected_q = (probs * np.linspace(-5, 5, 21)).sum(axis=2)
    np.testing.assert_allclose(algo.q(batch["obs"]).numpy(), expected_q, rtol=1e-5, atol=1e-5)
    grads, stats, priorities = algo.learn(batch, np.ones(32, np.float32))
    # The new priorities are the per-item cross-entropies, whose weighted mean is the loss.
    assert priorities.shape == (32,) and np.all(priorities > 0)
    assert stats["loss"] == pytest.approx(float(priorities.mean()), rel=1e-5)
    assert all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in grads)
    # The actor's initial priorities are the same quantity (its target is the online net;
    # the learner's target equals it right after a sync).
    np.testing.assert_allclose(algo.initial_priorities(batch), priorities, rtol=1e-5)


def test_c51_learning_moves_the_distribution_to_a_fixed_return():
    algo = build(num_atoms=11, v_min=0.0, v_max=10.0, dueling=False)
    rng = np.random.default_rng(1)
    batch = transitions(64, rng)
    batch["reward"][:] = 3.0
    batch["discount"][:] = 0.0  # terminal: the target is all mass on the atom 3.0
    optimizer = tf.keras.optimizers.Adam(0.05)
    variables = list(algo.variables.values())
    for _ in range(150):
        grads, _, _ = algo.learn(batch, np.ones(64, np.float32))
        optimizer.apply_gradients(zip([tf.constant(g) for g in grads], variables, strict=True))
    q_sa = algo.q(batch["obs"]).numpy()[np.arange(64), batch["action"]]
    np.testing.assert_allclose(q_sa, 3.0, atol=0.1)


def test_noisy_heads_explore_when_acting_and_not_when_evaluating():
    algo = build(noisy_sigma=5.0)
    names = set(algo.variables)
    assert {"q/advantage/w_sigma", "q/advantage/b_sigma", "q/value/w_sigma"} <= names
    obs = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
    greedy = algo.greedy(obs)
    assert all((algo.greedy(obs) == greedy).all() for _ in range(3))  # the means
    acted = [algo.act(obs, 0.0, np.random.default_rng(i)) for i in range(5)]
    assert any((a != greedy).any() for a in acted)  # the noise changes the actions
    grads, _, _ = algo.learn(transitions(32, np.random.default_rng(3)), np.ones(32, np.float32))
    by_name = dict(zip(algo.variables, grads, strict=True))
    assert np.abs(by_name["q/advantage/w_sigma"]).max() > 0  # the noise scales learn too


def test_noisy_dense_is_factorized_noise_around_the_means():
    layer = NoisyDense(5, 4, "layer", np.random.default_rng(0), sigma0=0.5)
    assert layer.w_sigma.numpy() == pytest.approx(np.full((5, 4), 0.5 / np.sqrt(5)))
    x = tf.constant(np.random.default_rng(1).normal(size=(3, 5)), tf.float32)
    mean = (x @ layer.w + layer.b).numpy()
    np.testing.assert_allclose(layer(x, noisy=False).numpy(), mean, rtol=1e-6)
    tf.random.set_seed(0)
    samples = np.stack([layer(x).numpy() for _ in range(2000)])
    assert np.abs(samples[0] - mean).max() > 1e-3
    np.testing.assert_allclose(samples.mean(axis=0), mean, atol=0.05)  # zero-mean noise


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: dqn.Params(num_atoms=0), "dqn: num_atoms must be >= 1"),
        (lambda: dqn.Params(v_min=1.0, v_max=1.0), "dqn: v_max must be > v_min"),
        (lambda: dqn.Params(noisy_sigma=-0.1), "dqn: noisy_sigma must be finite and >= 0"),
        (lambda: bcq.Params(num_atoms=51), "bcq: num_atoms must be 1"),
        (lambda: bcq.Params(noisy_sigma=0.5), "bcq: noisy_sigma must be 0"),
    ],
)
def test_rainbow_settings_are_checked(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_the_shipped_rainbow_config_has_every_switch_on():
    cfg = config_lib.load("configs/cartpole_rainbow.yaml")
    p = cfg.algorithm.params
    assert (p.double_q, p.dueling, p.n_step > 1, cfg.replay.prioritized) == (True,) * 4
    assert p.num_atoms > 1 and p.noisy_sigma > 0 and p.epsilon == 0.0
