"""Tests of easyrl.algorithms.ppo: GAE by hand, the loss and its gradients against an
independent float64 numpy computation, rollout collection on real envs, the round's
minibatch schedule and KL early stop, and the multi-device gradient split."""

import math
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from numeric import central_differences

from easyrl.algorithms import ppo
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.algorithms.ppo import Params, gae
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import ConfigError, EasyRLError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
MODEL = ModelConfig(hidden=(3,), activation="tanh")  # smooth: finite differences are exact
LOG_2PI = math.log(2 * math.pi)

# Known parameter values. "pi/head" stands for pi/logits (Discrete) or pi/mean (Box).
SHARED = {
    "pi/torso/0/w": [[0.5, -0.3, 0.2], [0.1, 0.4, -0.6], [-0.2, 0.3, 0.5]],
    "pi/torso/0/b": [0.1, -0.05, 0.2],
    "vf/torso/0/w": [[0.3, 0.2, -0.4], [-0.5, 0.1, 0.3], [0.2, -0.6, 0.1]],
    "vf/torso/0/b": [0.0, 0.1, -0.1],
    "vf/out/w": [[0.7], [-0.4], [0.5]],
    "vf/out/b": [0.2],
}
DISCRETE_HEAD = {
    "pi/logits/w": [[0.7, -0.4, 0.1], [0.2, 0.5, -0.3], [-0.3, 0.6, 0.4]],
    "pi/logits/b": [0.05, -0.1, 0.0],
}
BOX_HEAD = {
    "pi/mean/w": [[0.6, -0.2], [-0.4, 0.3], [0.2, 0.5]],
    "pi/mean/b": [0.1, -0.1],
    "pi/log_std": [-0.5, 0.3],
}
OBS = [
    [1.0, 0.5, -0.5],
    [-1.0, 1.5, 0.5],
    [0.3, -0.7, 1.2],
    [0.8, 1.0, -0.2],
    [0.0, 2.0, 1.0],
    [1.5, -1.0, 0.6],
]
DISCRETE_ACTION = [0, 2, 1, 1, 0, 2]
BOX_ACTION = [[0.5, -1.2], [1.4, 0.3], [-0.2, 0.8], [0.9, -0.4], [-1.1, 1.5], [0.0, 0.2]]
# Wanted ratios pi_new / pi_old and advantages (mean 0): per item, in order, the surrogate is
# unclipped, clipped, clipped, unclipped, inside, inside (clip 0.2).
RATIO = [0.5, 0.5, 1.35, 1.35, 0.9, 1.1]
ADVANTAGE = [1.0, -0.5, 2.0, -1.5, 0.8, -1.8]
VALUE_SHIFT = [0.5, -0.5, 0.1, -0.1, 0.4, 0.0]  # V - V_old
TARGET_SHIFT = [0.8, 0.6, -0.4, 0.2, -0.9, 0.7]  # V_target - V


def f32(x) -> np.ndarray:
    """What the module sees: the float32 value, as float64 for the reference."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def values_for(discrete: bool) -> dict[str, np.ndarray]:
    return {k: f32(v) for k, v in {**SHARED, **(DISCRETE_HEAD if discrete else BOX_HEAD)}.items()}


def build(discrete: bool = True, model=MODEL, **changes):
    changes.setdefault("grad_clip", 0.0)
    space = DISCRETE if discrete else BOX
    return ppo.build(Params(**changes), OBS_SPACE, space, model, seed=3)


def set_network(algo, values: dict[str, np.ndarray]) -> None:
    assert set(algo.variables) == set(values)
    for name, var in algo.variables.items():
        var.assign(np.asarray(values[name], np.float32))


# --- independent numpy reference (float64) ------------------------------------------------


def forward(p: dict, obs: np.ndarray, discrete: bool):
    """(logits or means [B, A], V [B])."""
    h = np.tanh(obs @ p["pi/torso/0/w"] + p["pi/torso/0/b"])
    head = "pi/logits" if discrete else "pi/mean"
    out = h @ p[f"{head}/w"] + p[f"{head}/b"]
    hv = np.tanh(obs @ p["vf/torso/0/w"] + p["vf/torso/0/b"])
    return out, (hv @ p["vf/out/w"] + p["vf/out/b"])[:, 0]


def log_prob_entropy(p: dict, obs, action, discrete: bool):
    out, _ = forward(p, obs, discrete)
    if discrete:
        log_p = out - np.log(np.sum(np.exp(out), axis=1, keepdims=True))
        return log_p[np.arange(len(action)), action], -np.sum(np.exp(log_p) * log_p, axis=1)
    log_std = p["pi/log_std"]
    std = np.exp(log_std)
    logp = np.sum(-0.5 * ((action - out) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=1)
    entropy = np.sum(log_std + 0.5 + 0.5 * np.log(2 * np.pi)) * np.ones(len(obs))
    return logp, entropy


def make_batch(discrete: bool) -> dict:
    """Old log-probs and values placed around the reference network's so that the ratios are
    RATIO and V - V_old = VALUE_SHIFT."""
    p = values_for(discrete)
    obs = f32(OBS)
    action = np.array(DISCRETE_ACTION) if discrete else f32(BOX_ACTION)
    logp, _ = log_prob_entropy(p, obs, action, discrete)
    _, value = forward(p, obs, discrete)
    return {
        "obs": np.array(OBS, np.float32),
        "action": action.astype(np.int64 if discrete else np.float32),
        "logp": (logp - np.log(RATIO)).astype(np.float32),
        "advantage": np.array(ADVANTAGE, np.float32),
        "value_target": (value + np.array(TARGET_SHIFT)).astype(np.float32),
        "value": (value - np.array(VALUE_SHIFT)).astype(np.float32),
    }


def reference(p: dict, batch: dict, discrete: bool, params: Params) -> dict:
    """The PPO loss pieces in float64, written from the equations."""
    obs, action = f32(batch["obs"]), batch["action"]
    action = action if discrete else f32(action)
    logp, entropy = log_prob_entropy(p, obs, action, discrete)
    ratio = np.exp(logp - f32(batch["logp"]))
    adv = f32(batch["advantage"])
    if params.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    clipped = np.clip(ratio, 1 - params.clip, 1 + params.clip)
    policy_loss = -np.mean(np.minimum(ratio * adv, clipped * adv))
    _, value = forward(p, obs, discrete)
    target, old = f32(batch["value_target"]), f32(batch["value"])
    err = (value - target) ** 2
    if params.value_clip > 0:
        value_c = old + np.clip(value - old, -params.value_clip, params.value_clip)
        err = np.maximum(err, (value_c - target) ** 2)
    value_loss = 0.5 * np.mean(err)
    loss = policy_loss + params.vf_coef * value_loss - params.ent_coef * np.mean(entropy)
    return {
        "loss": loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": np.mean(entropy),
        "approx_kl": np.mean(ratio - 1 - np.log(ratio)),
        "clip_frac": np.mean(np.abs(ratio - 1) > params.clip),
    }


def finite_difference_grads(batch, discrete, params) -> dict[str, np.ndarray]:
    def loss(p):
        return reference(p, batch, discrete, params)["loss"]

    return central_differences(values_for(discrete), loss)


# --- GAE ----------------------------------------------------------------------------------


def test_gae_hand_example_with_truncation_and_termination():
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45). Env 0 terminates at t=1, env 1 is truncated
    # at t=2 (its next value there is V(final obs) = 3.0, not the reset state's 0.5).
    rewards = np.array([[1, 0], [2, 1], [0, 1], [1, 2]], np.float32)
    values = np.array([[0.5, 1.0], [1.0, 2.0], [0.0, 1.5], [0.5, 0.5]], np.float32)
    next_values = np.array([[1.0, 2.0], [99.0, 1.5], [0.5, 3.0], [2.0, 1.0]], np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], bool)
    truncated = np.array([[0, 0], [0, 0], [0, 1], [0, 0]], bool)
    adv, target = gae(rewards, values, next_values, terminated, terminated | truncated, 0.9, 0.5)
    # Env 0: d3 = 1 + 0.9*2.0 - 0.5 = 2.3                 A3 = 2.3
    #        d2 = 0 + 0.9*0.5 - 0.0 = 0.45                A2 = 0.45 + 0.45*2.3 = 1.485
    #        d1 = 2 + 0 (terminal, 99 unused) - 1.0 = 1.0  A1 = 1.0 (nothing from A2)
    #        d0 = 1 + 0.9*1.0 - 0.5 = 1.4                 A0 = 1.4 + 0.45*1.0 = 1.85
    # Env 1: d3 = 2 + 0.9*1.0 - 0.5 = 2.4                 A3 = 2.4
    #        d2 = 1 + 0.9*3.0 - 1.5 = 2.2                 A2 = 2.2 (nothing from A3)
    #        d1 = 1 + 0.9*1.5 - 2.0 = 0.35                A1 = 0.35 + 0.45*2.2 = 1.34
    #        d0 = 0 + 0.9*2.0 - 1.0 = 0.8                 A0 = 0.8 + 0.45*1.34 = 1.403
    expected = [[1.85, 1.403], [1.0, 1.34], [1.485, 2.2], [2.3, 2.4]]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    # Targets = A + V: env 0 [2.35, 2.0, 1.485, 2.8], env 1 [2.403, 3.34, 3.7, 2.9].
    np.testing.assert_allclose(target, [[2.35, 2.403], [2.0, 3.34], [1.485, 3.7], [2.8, 2.9]])
    assert adv.dtype == np.float32 and target.dtype == np.float32
    np.testing.assert_array_equal(target, adv + values)
    # Without the cuts the advantages would leak across both boundaries.
    no_cut = np.zeros_like(terminated)
    leaky, _ = gae(rewards, values, next_values, no_cut, no_cut, 0.9, 0.5)
    assert leaky[1, 0] != pytest.approx(1.0) and leaky[2, 1] != pytest.approx(2.2)


def test_gae_limits():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    nv = np.concatenate([v[1:], rng.normal(size=(1, 3))])
    never = np.zeros((5, 3), bool)
    # lam = 0: one-step TD errors.
    adv, _ = gae(r, v, nv, never, never, 0.9, 0.0)
    np.testing.assert_allclose(adv, r + 0.9 * nv - v, rtol=1e-5, atol=1e-6)
    # lam = 1: discounted return (bootstrapped at the end) minus the value.
    adv, target = gae(r, v, nv, never, never, 0.9, 1.0)
    ret = nv[-1].copy()
    for t in reversed(range(5)):
        ret = r[t] + 0.9 * ret
        np.testing.assert_allclose(target[t], ret, rtol=1e-5, atol=1e-5)
    # A terminated step cuts the recursion even when `done` misses it.
    term = never.copy()
    term[2, 1] = True
    np.testing.assert_array_equal(
        gae(r, v, nv, term, never, 0.9, 0.7)[0], gae(r, v, nv, term, term, 0.9, 0.7)[0]
    )


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        gae(
            np.zeros((4, 2)),
            np.zeros((4, 2)),
            np.zeros((4, 3)),
            np.zeros((4, 2), bool),
            np.zeros((4, 2), bool),
            0.9,
            0.9,
        )
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        z = np.zeros(4)
        gae(z, z, z, z.astype(bool), z.astype(bool), 0.9, 0.9)


# --- module-level hooks -------------------------------------------------------------------


def test_hooks_and_replay_spec():
    step = {"lr_schedule": "step", "lr_step_factor": 0.5}
    params = Params(rollout_length=7, optimizer="rmsprop", lr=1e-4, **step)
    assert ppo.round_share(params, num_envs=3, actor_index=1, num_actors=4) == 21
    assert ppo.optimizer(params) == OptimizerSpec(
        kind="rmsprop", lr=1e-4, decay_rate=0.5, decay_steps=1000
    )
    f4 = np.dtype(np.float32)
    common = {"logp": ((), f4), "advantage": ((), f4), "value_target": ((), f4), "value": ((), f4)}
    assert ppo.replay_spec(params, OBS_SPACE, DISCRETE) == {
        "obs": ((3,), f4),
        "action": ((), np.dtype(np.int64)),
        **common,
    }
    assert ppo.replay_spec(params, OBS_SPACE, BOX) == {
        "obs": ((3,), f4),
        "action": ((2,), f4),
        **common,
    }


@pytest.mark.parametrize(
    "change",
    [
        {"gamma": 1.5},
        {"lam": -0.1},
        {"minibatch_size": 0},
        {"clip": 0.0},
        {"num_epochs": 0},
        {"kl_target": float("nan")},
        {"rollout_length": 0},
    ],
)
def test_params_are_checked(change):
    with pytest.raises(ConfigError, match=next(iter(change))):
        Params(**change)


@pytest.mark.parametrize(
    ("obs_space", "action_space", "model", "match"),
    [
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), DISCRETE, MODEL, "flat Box observation"),
        (OBS_SPACE, gym.spaces.MultiDiscrete([2, 2]), MODEL, "Discrete or a flat Box"),
        (OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, (2,)), MODEL, "finite Box action bounds"),
        (OBS_SPACE, DISCRETE, ModelConfig(kind="conv"), "mlp"),
    ],
    ids=["image", "multidiscrete", "unbounded", "conv"],
)
def test_build_refuses_unsupported_setups(obs_space, action_space, model, match):
    with pytest.raises(ConfigError, match=match):
        ppo.build(Params(), obs_space, action_space, model)


def test_variables_names_shapes_and_seeded_init():
    algo = build(discrete=False, model=ModelConfig(hidden=(5, 4)), log_std_init=-0.7)
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "pi/log_std": (2,),
        "pi/mean/b": (2,),
        "pi/mean/w": (4, 2),
        "pi/torso/0/b": (5,),
        "pi/torso/0/w": (3, 5),
        "pi/torso/1/b": (4,),
        "pi/torso/1/w": (5, 4),
        "vf/out/b": (1,),
        "vf/out/w": (4, 1),
        "vf/torso/0/b": (5,),
        "vf/torso/0/w": (3, 5),
        "vf/torso/1/b": (4,),
        "vf/torso/1/w": (5, 4),
    }
    assert list(algo.variables) == sorted(algo.variables)
    assert algo.flow == "sync_rounds"
    np.testing.assert_array_equal(algo.variables["pi/log_std"].numpy(), np.float32([-0.7, -0.7]))
    # Small policy head (0.01 * Glorot limit sqrt(6 / 6) = 0.01), value head at full scale.
    assert np.abs(algo.variables["pi/mean/w"].numpy()).max() <= 0.01
    assert np.abs(algo.variables["vf/out/w"].numpy()).max() > 0.05
    same = build(discrete=False, model=ModelConfig(hidden=(5, 4)), log_std_init=-0.7)
    other = ppo.build(Params(), OBS_SPACE, BOX, ModelConfig(hidden=(5, 4)), seed=4)
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), same.variables[name].numpy())
    assert not np.array_equal(algo.variables["pi/torso/0/w"], other.variables["pi/torso/0/w"])
    # The policy and the value torsos do not share their initial values.
    assert not np.array_equal(algo.variables["pi/torso/0/w"], algo.variables["vf/torso/0/w"])
    assert set(build(discrete=True).variables) == set(values_for(True))


# --- the loss -----------------------------------------------------------------------------


def test_loss_hand_numbers_discrete():
    """Zero policy weights (uniform over 3 actions) and a constant value 0.5."""
    algo = build(discrete=True, normalize_advantages=False)
    zero = {k: np.zeros_like(f32(v)) for k, v in values_for(True).items()}
    set_network(algo, {**zero, "vf/out/b": np.array([0.5])})
    ratio = np.array([0.5, 1.1, 1.5, 1.5])
    batch = {
        "obs": np.array(OBS[:4], np.float32),
        "action": np.array([0, 1, 2, 0], np.int64),
        "logp": (-np.log(3) - np.log(ratio)).astype(np.float32),
        "advantage": np.array([1.0, -1.0, 1.0, -1.0], np.float32),
        "value_target": np.array([1.5, 0.5, -0.5, 0.0], np.float32),
        "value": np.array([0.0, 0.5, 1.0, 0.6], np.float32),
    }
    _, stats, _ = algo.learn_minibatch(batch)
    # min(r A, clip(r) A): 0.5 (not 0.8), -1.1, 1.2 (not 1.5), -1.5 (not -1.2) -> mean -0.225.
    assert stats["policy_loss"] == pytest.approx(0.225, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(0.75)  # 0.5, 1.5, 1.5 are outside [0.8, 1.2]
    # (r - 1) - ln r: 0.19314718, 0.00468982, 0.09453489 (twice) -> mean 0.0967267.
    assert stats["approx_kl"] == pytest.approx(0.0967267, rel=1e-4)
    assert stats["entropy"] == pytest.approx(math.log(3), rel=1e-6)
    # (V - Vt)^2 = 1, 0, 1, 0.25 -> 0.5 * 2.25 / 4.
    assert stats["value_loss"] == pytest.approx(0.28125, rel=1e-6)
    clipped = build(discrete=True, normalize_advantages=False, value_clip=0.2)
    set_network(clipped, {**zero, "vf/out/b": np.array([0.5])})
    # V - V_old = 0.5, 0, -0.5, -0.1 -> V_c = 0.2, 0.5, 0.8, 0.5; (V_c - Vt)^2 = 1.69, 0,
    # 1.69, 0.25; max with the plain errors: 1.69, 0, 1.69, 0.25 -> 0.5 * 3.63 / 4.
    assert clipped.learn_minibatch(batch)[1]["value_loss"] == pytest.approx(0.45375, rel=1e-6)


def test_loss_hand_numbers_gaussian():
    """Zero mean, std (0.5, 1): log N(a) = -0.5 (4 a0^2 + a1^2) + ln 2 - ln 2 pi."""
    algo = build(discrete=False, normalize_advantages=False)
    zero = {k: np.zeros_like(f32(v)) for k, v in values_for(False).items()}
    set_network(algo, {**zero, "pi/log_std": np.log([0.5, 1.0])})
    action = np.array([[0.5, -1.0], [0.25, 2.0]])
    # a = (0.5, -1): -0.5 (1 + 1) + 0.693147 - 1.837877 = -2.144730
    # a = (0.25, 2): -0.5 (0.25 + 4) + 0.693147 - 1.837877 = -3.269730
    logp = np.array([-2.144730, -3.269730])
    batch = {
        "obs": np.array(OBS[:2], np.float32),
        "action": action.astype(np.float32),
        "logp": (logp - np.log([1.1, 0.5])).astype(np.float32),  # ratios 1.1 and 0.5
        "advantage": np.array([2.0, 1.0], np.float32),
        "value_target": np.zeros(2, np.float32),
        "value": np.zeros(2, np.float32),
    }
    _, stats, _ = algo.learn_minibatch(batch)
    # min(1.1 * 2, 1.1 * 2) = 2.2; min(0.5, 0.8) = 0.5 -> -(2.7 / 2).
    assert stats["policy_loss"] == pytest.approx(-1.35, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(0.5)
    # H = ln 0.5 + 0 + 2 * 0.5 * (1 + ln 2 pi) = -0.693147 + 2.837877.
    assert stats["entropy"] == pytest.approx(2.144730, rel=1e-6)


@pytest.mark.parametrize(
    ("discrete", "changes"),
    [
        (True, {}),
        (True, {"normalize_advantages": False, "value_clip": 0.3, "ent_coef": 0.05}),
        (False, {"value_clip": 0.3, "ent_coef": 0.05, "vf_coef": 1.0}),
        (False, {"normalize_advantages": False, "clip": 0.15}),
    ],
    ids=["discrete", "discrete-vclip-ent", "box-vclip-ent", "box-raw"],
)
def test_loss_and_gradients_match_reference(discrete, changes):
    algo = build(discrete=discrete, **changes)
    set_network(algo, values_for(discrete))
    batch = make_batch(discrete)
    ref = reference(values_for(discrete), batch, discrete, algo.params)
    grads, stats, _ = algo.learn_minibatch(batch)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    expected = finite_difference_grads(batch, discrete, algo.params)
    assert len(grads) == len(algo.variables)
    for grad, name in zip(grads, algo.variables, strict=True):
        assert grad.shape == expected[name].shape, name
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
        assert np.abs(expected[name]).max() > 1e-4, name  # every variable gets a gradient
    # Learning does not change the variables (the PS applies the gradients).
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), values_for(discrete)[name].astype(np.float32))


def test_reference_batch_covers_the_clipping_regimes():
    for discrete in (True, False):
        batch = make_batch(discrete)
        p = values_for(discrete)
        logp, _ = log_prob_entropy(p, f32(batch["obs"]), batch["action"], discrete)
        ratio = np.exp(logp - f32(batch["logp"]))
        np.testing.assert_allclose(ratio, RATIO, rtol=1e-5)
        _, value = forward(p, f32(batch["obs"]), discrete)
        old, target = f32(batch["value"]), f32(batch["value_target"])
        value_c = old + np.clip(value - old, -0.3, 0.3)
        clipped_wins = (value_c - target) ** 2 > (value - target) ** 2 + 1e-3
        plain_wins = (value_c - target) ** 2 < (value - target) ** 2 - 1e-3
        assert clipped_wins.any() and plain_wins.any()


def test_gradient_clipping_to_global_norm():
    algo = build(discrete=True, grad_clip=0.01)
    set_network(algo, values_for(True))
    batch = make_batch(True)
    grads, _, _ = algo.learn_minibatch(batch)
    expected = finite_difference_grads(batch, True, algo.params)
    raw_norm = np.sqrt(sum(np.sum(g**2) for g in expected.values()))
    assert raw_norm > 10 * 0.01
    assert np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)) == pytest.approx(0.01)
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(grad, expected[name] * 0.01 / raw_norm, rtol=1e-4, atol=1e-9)


# --- acting -------------------------------------------------------------------------------


def one_step_batch(algo, obs: np.ndarray, rng) -> tuple[np.ndarray, dict]:
    """Acts once with a rollout_length 1 collector; returns (env actions, stored batch)."""
    collector = algo.collector(len(obs), seed=0)
    env_action = collector.act(obs, rng)
    n = len(obs)
    batch = collector.observe(np.zeros(n), obs, obs, np.zeros(n, bool), np.zeros(n, bool))
    return env_action, batch


def test_gaussian_act_log_prob_and_clipping():
    algo = build(discrete=False, rollout_length=1)
    values = {**values_for(False), "pi/log_std": f32([0.4, 0.2])}  # wide: many clipped samples
    set_network(algo, values)
    obs = np.random.default_rng(1).uniform(-2, 2, (500, 3)).astype(np.float32)
    env_action, batch = one_step_batch(algo, obs, np.random.default_rng(2))
    action = batch["action"].astype(np.float64)
    mean, value = forward(values, f32(obs), False)
    std = np.exp(values["pi/log_std"])
    logp = np.sum(-0.5 * ((action - mean) / std) ** 2 - np.log(std) - 0.5 * LOG_2PI, axis=1)
    np.testing.assert_allclose(batch["logp"], logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch["value"], value, rtol=1e-5, atol=1e-6)
    # The noise is standard normal: z = (a - mu) / sigma.
    z = (action - mean) / std
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1
    assert (np.abs(action) > 1).any()
    np.testing.assert_array_equal(env_action, np.clip(batch["action"], -1, 1))
    assert env_action.dtype == np.float32
    np.testing.assert_allclose(algo.greedy(obs), np.clip(mean, -1, 1), rtol=1e-5, atol=1e-6)


def test_discrete_act_samples_the_softmax():
    algo = build(discrete=True, rollout_length=1)
    values = values_for(True)
    set_network(algo, values)
    obs = np.repeat(np.array(OBS[:1], np.float32), 20_000, axis=0)
    env_action, batch = one_step_batch(algo, obs, np.random.default_rng(3))
    logits, _ = forward(values, f32(obs[:1]), True)
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
    # 20000 draws: each frequency within ~5 standard deviations (<= 0.0036).
    np.testing.assert_allclose(np.bincount(env_action, minlength=3) / 20_000, probs, atol=0.018)
    np.testing.assert_allclose(batch["logp"], np.log(probs)[env_action], rtol=1e-5)
    np.testing.assert_array_equal(batch["action"], env_action)
    assert algo.greedy(obs[:1])[0] == np.argmax(logits[0])
    # The same rng seed gives the same actions.
    again, _ = one_step_batch(algo, obs[:50], np.random.default_rng(3))
    np.testing.assert_array_equal(again, env_action[:50])


def test_collector_checks_the_protocol():
    algo = build(discrete=True, rollout_length=2)
    collector = algo.collector(2, seed=0)
    obs = np.zeros((2, 3), np.float32)
    no = np.zeros(2, bool)
    with pytest.raises(EasyRLError, match="without a preceding act"):
        collector.observe(np.zeros(2), obs, obs, no, no)
    collector.act(obs)
    with pytest.raises(EasyRLError, match="twice"):
        collector.act(obs)
    with pytest.raises(EasyRLError, match="rows"):
        collector.observe(np.zeros(3), obs, obs, no, no)
    assert collector.observe(np.zeros(2), obs, obs, no, no) is None
    collector.start_round()  # drops the partial round
    with pytest.raises(EasyRLError, match=r"obs must be \[2, 3\]"):
        collector.act(np.zeros((3, 3)))


# --- rollouts on real environments ---------------------------------------------------------


def run_rounds(algo, env_id, num_envs, rounds, **env_kwargs):
    """Steps a real vector env; returns (batches, per-step records, steps at which a batch
    came back)."""
    env = make_vector_env(env_id, num_envs, vector="sync", seed=0, **env_kwargs)
    collector = algo.collector(num_envs, seed=0)
    assert collector.resets_envs is False
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    batches, records, returned_at = [], [], []
    try:
        for step in range(rounds * algo.params.rollout_length):
            if step % algo.params.rollout_length == 0:
                collector.start_round()
            action = collector.act(obs, rng)
            assert env.single_action_space.contains(action[0])
            next_obs, reward, terminated, truncated, infos = env.step(action)
            real = final_observations(next_obs, infos, terminated | truncated)
            records.append((obs, reward, real, terminated, truncated))
            out = collector.observe(reward, next_obs, real, terminated, truncated)
            if out is not None:
                batches.append(out)
                returned_at.append(step + 1)
            obs = next_obs
    finally:
        env.close()
    return batches, records, returned_at


def check_batch(algo, batch, env):
    spec = ppo.replay_spec(algo.params, *env)
    assert set(batch) == set(spec)
    n = algo.params.rollout_length * 4
    for name, (shape, dtype) in spec.items():
        assert batch[name].shape == (n, *shape), name
        assert batch[name].dtype == dtype, name
        assert np.isfinite(batch[name]).all(), name
    np.testing.assert_array_equal(batch["value_target"], batch["advantage"] + batch["value"])


def test_cartpole_rounds_bootstrap_truncations_from_the_final_observation():
    spaces = (gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2))
    params = Params(rollout_length=30, gamma=0.9, lam=0.8)
    algo = ppo.build(params, *spaces, ModelConfig(hidden=(8,)), seed=0)
    batches, records, returned_at = run_rounds(algo, "CartPole-v1", 4, 2, max_episode_steps=20)
    assert returned_at == [30, 60]
    for batch in batches:
        check_batch(algo, batch, spaces)
    # Recompute the first round from the records with the same (unchanged) network.
    obs, reward, real, terminated, truncated = (np.stack(x) for x in zip(*records[:30]))
    assert truncated.any() and terminated.any()
    np.testing.assert_array_equal(batches[0]["obs"], obs.reshape(120, 4))  # time-major
    values = batches[0]["value"].reshape(30, 4)
    np.testing.assert_allclose(values, algo.value(obs.reshape(-1, 4)).reshape(30, 4), atol=1e-5)
    next_values = np.concatenate([values[1:], np.zeros((1, 4))])
    done = terminated | truncated
    done[-1] = True  # the round's last step bootstraps from V(real next obs) too
    next_values[done] = algo.value(real[done])
    adv, _ = gae(reward, values, next_values, terminated, terminated | truncated, 0.9, 0.8)
    np.testing.assert_allclose(batches[0]["advantage"], adv.reshape(-1), rtol=1e-4, atol=1e-5)
    # Bootstrapping truncated rows from the reset observation instead gives other numbers.
    wrong = np.concatenate([values[1:], algo.value(real[-1])[None]])
    wrong_adv, _ = gae(reward, values, wrong, terminated, terminated | truncated, 0.9, 0.8)
    assert not np.allclose(batches[0]["advantage"], wrong_adv.reshape(-1), atol=1e-3)


def test_pendulum_round_and_learn_smoke():
    env_id = "Pendulum-v1"
    algo = ppo.build(
        Params(rollout_length=16, minibatch_size=16, num_epochs=2, log_std_init=0.5),
        gym.spaces.Box(-8, 8, (3,)),
        gym.spaces.Box(-2.0, 2.0, (1,)),
        MODEL,
        seed=0,
    )
    batches, records, _ = run_rounds(algo, env_id, 4, 1, max_episode_steps=10)
    assert any(r[4].any() for r in records)  # truncations happened
    check_batch(algo, batches[0], (gym.spaces.Box(-8, 8, (3,)), gym.spaces.Box(-2, 2, (1,))))
    assert (np.abs(batches[0]["action"]) > 2).any()  # stored unclipped
    steps = list(algo.learn_round(batches[0], np.random.default_rng(0)))
    assert len(steps) == 2 * 4
    for grads, stats, _ in steps:
        assert [g.shape for g in grads] == [tuple(v.shape) for v in algo.variables.values()]
        assert all(np.isfinite(g).all() for g in grads)
        assert all(np.isfinite(v) for v in stats.values())


# --- learn_round ---------------------------------------------------------------------------


def synthetic_batch(algo, n: int, seed: int) -> dict:
    """Acted on random observations; the advantage rewards action 1 iff obs[0] > 0."""
    obs = np.random.default_rng(seed).uniform(-1, 1, (n, 3)).astype(np.float32)
    _, batch = one_step_batch(algo, obs, np.random.default_rng(seed + 1))
    good = batch["action"] == (obs[:, 0] > 0)
    batch["advantage"] = np.where(good, 1.0, -1.0).astype(np.float32)
    batch["value_target"] = obs[:, 0].copy()
    return batch


def sgd(algo, grads, lr):
    for var, grad in zip(algo.variables.values(), grads, strict=True):
        var.assign(var.numpy() - lr * grad)


def test_learn_round_minibatch_schedule():
    algo = build(
        discrete=True,
        model=ModelConfig(hidden=(8,)),
        rollout_length=1,
        num_epochs=3,
        minibatch_size=32,
    )
    batch = synthetic_batch(algo, 100, seed=0)
    seen = []
    learn = algo.learn_minibatch
    algo.learn_minibatch = lambda mb: (seen.append(mb["obs"]), learn(mb))[1]
    steps = list(algo.learn_round(batch, np.random.default_rng(0)))
    assert len(steps) == 3 * math.ceil(100 / 32)
    assert [len(mb) for mb in seen] == [25] * 12  # near-equal parts, nothing dropped
    for epoch in range(3):
        rows = np.concatenate(seen[4 * epoch : 4 * epoch + 4])
        np.testing.assert_array_equal(np.unique(rows, axis=0), np.unique(batch["obs"], axis=0))
    assert not np.array_equal(seen[0], seen[4])  # reshuffled each epoch
    for _, stats, _ in steps:
        assert set(stats) == {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"}
        assert all(isinstance(v, float) for v in stats.values())
    with pytest.raises(EasyRLError, match="lacks columns"):
        next(algo.learn_round({"obs": batch["obs"]}, np.random.default_rng(0)))


def test_kl_target_stops_the_round_early():
    params = {"rollout_length": 1, "num_epochs": 4, "minibatch_size": 25, "kl_target": 1e-6}
    algo = build(discrete=True, model=ModelConfig(hidden=(8,)), **params)
    batch = synthetic_batch(algo, 100, seed=0)
    # Unchanged weights: the KL stays 0, every epoch runs.
    assert len(list(algo.learn_round(batch, np.random.default_rng(0)))) == 16
    # Weights that move: the first epoch's mean KL exceeds 1.5e-6, the round stops after it.
    count = 0
    for grads, _, _ in algo.learn_round(batch, np.random.default_rng(0)):
        sgd(algo, grads, lr=0.5)
        count += 1
    assert count == 4


def test_learning_rounds_improve_the_surrogate():
    algo = build(
        discrete=True,
        model=ModelConfig(hidden=(16,)),
        rollout_length=1,
        num_epochs=4,
        minibatch_size=50,
        grad_clip=1.0,
    )
    batch = synthetic_batch(algo, 200, seed=5)
    before = algo.learn_minibatch(batch)[1]
    rng = np.random.default_rng(0)
    for _ in range(3):
        for grads, _stats, _ in algo.learn_round(batch, rng):
            sgd(algo, grads, lr=1.0)
    after = algo.learn_minibatch(batch)[1]
    assert abs(before["policy_loss"]) < 1e-5  # ratio 1: -mean(normalized A) = 0
    assert after["policy_loss"] < -0.05
    assert after["value_loss"] < before["value_loss"]
    assert after["approx_kl"] > 0


# --- multi-device --------------------------------------------------------------------------

MULTI_DEVICE = textwrap.dedent(
    """
    import gymnasium as gym, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from easyrl.algorithms.ppo import Params
    from easyrl.algorithms.ppo.agent import PPO
    from easyrl.config import ModelConfig
    from easyrl.models.flat import FlatVariables
    obs_space = gym.spaces.Box(-10, 10, (3,))
    for space in (gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))):
        params = Params(value_clip=0.3, ent_coef=0.01, grad_clip=0.0, rollout_length=1,
                        minibatch_size=7, num_epochs=1)
        model = ModelConfig(hidden=(8,), activation="tanh")
        single = PPO(params, obs_space, space, model, seed=1)
        multi = PPO(params, obs_space, space, model, seed=1, devices=["/cpu:0", "/cpu:1"])
        assert single.strategy is None and multi.strategy.num_replicas_in_sync == 2
        assert list(single.variables) == list(multi.variables)
        rng = np.random.default_rng(0)
        for name, var in single.variables.items():  # move away from the init, on both
            new = var.numpy() + rng.normal(0, 0.3, var.shape).astype(np.float32)
            var.assign(new)
            multi.variables[name].assign(new)
        obs = rng.uniform(-1, 1, (7, 3)).astype(np.float32)  # odd: replicas get 3 and 4
        collector = single.collector(7, seed=0)
        collector.act(obs, rng)
        batch = collector.observe(np.zeros(7), obs, obs, np.zeros(7, bool), np.zeros(7, bool))
        batch["logp"] += rng.normal(0, 0.3, 7).astype(np.float32)
        batch["advantage"] = rng.normal(size=7).astype(np.float32)
        batch["value_target"] = rng.normal(size=7).astype(np.float32)
        (g1, s1, _), = single.learn_round(batch, np.random.default_rng(0))
        (g2, s2, _), = multi.learn_round(batch, np.random.default_rng(0))
        for a, b, name in zip(g1, g2, single.variables):
            assert np.abs(a).max() > 1e-4, name
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0, err_msg=name)
        for key in s1:
            assert abs(s1[key] - s2[key]) < 1e-5, key
        # The runtime swaps weights in through FlatVariables: mirrored copies follow.
        flat = FlatVariables(list(multi.variables.values()))
        flat.assign(flat.read().numpy() * 0.5)
        halved, _, _ = multi.learn_minibatch(batch)
        for name, var in single.variables.items():
            var.assign(var.numpy() * 0.5)
        for a, b, name in zip(single.learn_minibatch(batch)[0], halved, single.variables):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0, err_msg=name)
        clipped = PPO(Params(grad_clip=0.05), obs_space, space, model, seed=1,
                      devices=["/cpu:0", "/cpu:1"])
        for name, var in multi.variables.items():
            clipped.variables[name].assign(var.numpy())
        g3, _, _ = clipped.learn_minibatch(batch)
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in g3))
        assert abs(norm - 0.05) < 1e-6, norm
    print("MULTI-DEVICE OK")
    """
)


@pytest.mark.cluster
def test_multi_device_gradient_equals_single_device():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", MULTI_DEVICE], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MULTI-DEVICE OK" in result.stdout


# --- observation normalization ---------------------------------------------------------


def test_observation_statistics_merge_to_the_moments_of_everything_seen():
    algo = build(normalize_observations=True, obs_clip=3.0)
    assert {"obs_norm/mean", "obs_norm/var", "obs_norm/count"} <= set(algo.variables)
    rng = np.random.default_rng(5)
    rounds = [rng.normal([1.0, -2.0, 0.5], [0.5, 2.0, 1.0], size=(n, 3)) for n in (7, 40, 13)]
    for obs in rounds:
        changed = algo.end_round({"obs": obs.astype(np.float32)})
        assert changed == ["obs_norm/count", "obs_norm/mean", "obs_norm/var"]
    seen = np.concatenate(rounds)
    # The 1e-4 prior count barely moves the result.
    np.testing.assert_allclose(algo.variables["obs_norm/mean"].numpy(), seen.mean(0), atol=1e-4)
    np.testing.assert_allclose(algo.variables["obs_norm/var"].numpy(), seen.var(0), rtol=1e-3)
    assert algo.variables["obs_norm/count"].numpy() == pytest.approx(60, abs=1e-3)
    # The networks see clip((obs - mean) / std, -3, 3), and no gradient reaches the statistics.
    obs = np.array([[1.0, -2.0, 0.5], [100.0, 0.0, 0.0]], np.float32)
    z = algo.obs_norm(obs).numpy()
    expected = (obs - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8)
    np.testing.assert_allclose(z, np.clip(expected, -3, 3), atol=1e-3)
    grads, _, _ = algo.learn_minibatch(make_batch(discrete=True))
    for name, grad in zip(algo.variables, grads, strict=True):
        if name.startswith("obs_norm/"):
            assert not np.any(grad), name


def test_without_normalization_end_round_changes_nothing():
    algo = build()
    assert not any(n.startswith("obs_norm/") for n in algo.variables)
    assert algo.end_round({"obs": np.ones((4, 3), np.float32)}) == []
