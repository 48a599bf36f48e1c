"""Tests of easyrl.algorithms.a2c and easyrl.algorithms.pg: one step per round on PPO's agent
is exactly the advantage actor-critic / REINFORCE-with-baseline gradient."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl.algorithms import a2c, pg, ppo, registry
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.config import ModelConfig
from easyrl.errors import ConfigError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
MODEL = ModelConfig(hidden=(8,), activation="tanh")


def round_batch(algo, n: int, rng: np.random.Generator) -> dict:
    """A round as an actor ships it: actions sampled from the policy, their log-probs and
    values under the current weights (so the ratio is 1), arbitrary advantages and targets."""
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    noise = rng.gumbel(size=(n, 3)) if algo.discrete else rng.standard_normal((n, 2))
    action, logp, value = algo._act(obs, noise.astype(np.float32))
    return {
        "obs": obs,
        "action": action.numpy(),
        "logp": logp.numpy(),
        "advantage": rng.normal(size=n).astype(np.float32),
        "value_target": rng.normal(size=n).astype(np.float32),
        "value": value.numpy(),
    }


def reference_gradients(algo, batch: dict, vf_coef: float, ent_coef: float, normalize: bool):
    """The textbook actor-critic gradient, with a GradientTape on the agent's own networks:
    -mean(A log pi(a|s)) + vf_coef * 0.5 * mean((V(s) - Vt)^2) - ent_coef * mean(H)."""
    advantage = batch["advantage"].astype(np.float64)
    if normalize:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    with tf.GradientTape() as tape:
        logp, entropy = algo.pi.log_prob_entropy(batch["obs"], batch["action"])
        value = algo.vf(batch["obs"])
        loss = (
            -tf.reduce_mean(tf.constant(advantage, tf.float32) * logp)
            + vf_coef * 0.5 * tf.reduce_mean(tf.square(value - batch["value_target"]))
            - ent_coef * tf.reduce_mean(entropy)
        )
    grads = tape.gradient(loss, list(algo.variables.values()))
    return {name: g.numpy() for name, g in zip(algo.variables, grads, strict=True)}


@pytest.mark.parametrize(
    "module, params, action_space",
    [
        (a2c, a2c.Params(grad_clip=0.0, ent_coef=0.05), DISCRETE),
        (a2c, a2c.Params(grad_clip=0.0, normalize_advantages=True), BOX),
        (pg, pg.Params(grad_clip=0.0, ent_coef=0.02), DISCRETE),
    ],
)
def test_one_step_per_round_is_the_policy_gradient(module, params, action_space):
    algo = module.build(params, OBS_SPACE, action_space, MODEL, seed=3, learner=True)
    rng = np.random.default_rng(0)
    batch = round_batch(algo, 300, rng)
    steps = list(algo.learn_round(batch, rng))
    assert len(steps) == 1  # one gradient step on the whole round
    grads, stats, _ = steps[0]
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6) and stats["clip_frac"] == 0.0
    expected = reference_gradients(
        algo, batch, params.vf_coef, params.ent_coef, params.normalize_advantages
    )
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(grad, expected[name], rtol=2e-4, atol=2e-6, err_msg=name)
        assert np.abs(expected[name]).max() > 1e-5, name  # every variable gets a gradient


def test_settings_map_onto_ppo_one_epoch_one_minibatch():
    mapped = a2c.Params(lam=0.9, rollout_length=7, lr=2e-3).ppo_params()
    assert (mapped.lam, mapped.rollout_length, mapped.lr) == (0.9, 7, 2e-3)
    assert mapped.num_epochs == 1 and mapped.minibatch_size >= 2**40
    assert mapped.value_clip == 0.0 and mapped.kl_target == 0.0
    assert pg.Params().ppo_params().lam == 1.0  # Monte-Carlo returns minus the baseline
    for module in (a2c, pg):
        assert module.SPEC.flow == "sync_rounds" and module.SPEC.replay_kinds == ("aggregate",)
        assert module.round_share(module.Params(rollout_length=6), 4, 0, 2) == 24
        assert module.optimizer(module.Params(lr=0.01)) == OptimizerSpec(kind="adam", lr=0.01)
        spec = module.replay_spec(module.Params(), OBS_SPACE, DISCRETE)
        assert spec == ppo.replay_spec(ppo.Params(), OBS_SPACE, DISCRETE)
    assert {"a2c", "pg"} <= set(registry.known())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: a2c.Params(lam=1.5), "a2c: lam must be in \\[0, 1\\]"),
        (lambda: a2c.Params(rollout_length=0), "a2c: rollout_length must be >= 1"),
        (lambda: pg.Params(lr=float("nan")), "pg: lr must be finite and > 0"),
        (lambda: pg.Params(gamma=-0.1), "pg: gamma must be in \\[0, 1\\]"),
    ],
)
def test_params_are_checked_and_name_their_algorithm(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_build_names_the_algorithm_in_its_errors():
    conv = ModelConfig(kind="conv", conv=((8, 3, 2),))
    with pytest.raises(ConfigError, match="model.kind: pg builds its networks from model.kind mlp"):
        pg.build(pg.Params(), OBS_SPACE, DISCRETE, conv)
    image = gym.spaces.Box(0, 255, shape=(8, 8, 1), dtype=np.uint8)
    with pytest.raises(ConfigError, match="a2c needs a flat Box observation"):
        a2c.replay_spec(a2c.Params(), image, DISCRETE)
