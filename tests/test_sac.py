"""Tests of easyrl.algorithms.sac: the tanh-squashed log-probability against numerical
references, the critic/actor/temperature losses and gradients against an independent float64
numpy computation, the direction the temperature moves, Polyak targets,
initial priorities, the collector on Pendulum and the config checks."""

import math

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from numeric import central_differences
from test_td3 import (
    ACTION,
    ACTION_SPACE,
    DISCOUNT,
    MODEL,
    NEXT_OBS,
    OBS,
    OBS_SPACE,
    REWARD,
    WEIGHTS,
    f64,
    known_values,
    make_batch,
    target_variables,
)
from test_td3 import build as build_agent

from easyrl.algorithms import sac
from easyrl.algorithms.continuous import scale_actions
from easyrl.algorithms.optimizers import LocalOptimizer, OptimizerSpec
from easyrl.algorithms.sac import Params
from easyrl.algorithms.sac.agent import LOG_STD_MAX, LOG_STD_MIN, squashed_log_prob
from easyrl.algorithms.sac.agent import log_one_minus_tanh_sq as stable_log_jacobian
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import ConfigError

# Standard normal: [0] for a' ~ pi(.|s') in the target, [1] for a ~ pi(.|s).
NOISE = [
    [[0.3, -0.1], [1.2, 1.5], [-1.4, 0.2], [0.0, -0.4], [0.7, 2.1]],
    [[-0.6, 0.9], [0.4, -1.3], [1.8, 0.05], [-0.2, 0.6], [1.1, -1.7]],
]
LOG_2PI = math.log(2 * math.pi)


def build(**changes):
    return build_agent(sac, **changes)


def set_networks(algo, online: dict, target: dict) -> None:
    """Sets the online variables to `online` and the target critics to `target`'s critics."""
    for name, var in algo.variables.items():
        var.assign(online[name].astype(np.float32))
    targets = target_variables(algo)
    assert set(targets) == {f"target_{n}" for n in online if n.startswith("critic/")}
    for name, var in targets.items():
        var.assign(target[name.removeprefix("target_")].astype(np.float32))


def setup(**changes):
    algo = build(**changes)
    online, target = known_values(algo, 1), known_values(algo, 2)
    set_networks(algo, online, target)
    return algo, online, target


# --- the squashed Gaussian log-probability ------------------------------------------------


def normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.parametrize("mean, std", [(0.3, 0.8), (-1.2, 0.4), (0.0, 2.0)])
def test_squashed_log_prob_is_the_density_of_tanh_of_a_gaussian(mean, std):
    a = np.linspace(-0.995, 0.995, 199)  # [K]
    u = np.arctanh(a)
    got = squashed_log_prob(
        tf.constant(u[:, None], tf.float32),
        tf.constant(np.full((len(a), 1), mean), tf.float32),
        tf.constant(np.full((len(a), 1), math.log(std)), tf.float32),
    ).numpy()  # [K]
    assert got.shape == (len(a),)
    # Numerical reference: p_a = d/da P(tanh(U) <= a) = d/da Phi((atanh(a) - mean) / std).
    h = 1e-6
    density = (
        normal_cdf((np.arctanh(a + h) - mean) / std) - normal_cdf((np.arctanh(a - h) - mean) / std)
    ) / (2 * h)
    np.testing.assert_allclose(np.exp(got), density, rtol=2e-4, atol=1e-7)
    # Change of variables in closed form: p_a(a) = p_u(atanh a) / (1 - a^2).
    p_u = np.exp(-0.5 * ((u - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    np.testing.assert_allclose(got, np.log(p_u / (1 - a**2)), rtol=1e-5, atol=1e-5)
    # The density integrates to 1 over (-1, 1) (trapezoid on a fine grid).
    fine = np.linspace(-1 + 1e-7, 1 - 1e-7, 400_001)
    fine_u = np.arctanh(fine)
    p = np.exp(-0.5 * ((fine_u - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    fine_logp = squashed_log_prob(
        tf.constant(fine_u[:, None]),
        tf.constant([[mean]], tf.float64),
        tf.constant([[math.log(std)]], tf.float64),
    ).numpy()
    np.testing.assert_allclose(fine_logp, np.log(p) - np.log1p(-(fine**2)), atol=1e-5)
    assert np.trapezoid(np.exp(fine_logp), fine) == pytest.approx(1.0, abs=1e-4)


def test_squashed_log_prob_sums_over_action_dimensions():
    u = np.array([[0.4, -1.1, 2.5], [-0.3, 0.0, 0.8]])
    mean = np.array([[0.1, -0.5, 1.0], [0.2, 0.3, -0.4]])
    log_std = np.array([[-0.5, 0.2, 0.0], [0.1, -1.0, 0.4]])
    got = squashed_log_prob(tf.constant(u), tf.constant(mean), tf.constant(log_std)).numpy()
    std = np.exp(log_std)
    per_dim = (
        -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * LOG_2PI - np.log(1 - np.tanh(u) ** 2)
    )
    np.testing.assert_allclose(got, per_dim.sum(axis=1), rtol=1e-10)


def test_stable_tanh_correction_equals_the_naive_form_and_stays_finite():
    u = np.linspace(-8.0, 8.0, 161)
    naive = np.log(1.0 - np.tanh(u) ** 2)  # float64: accurate on this range
    np.testing.assert_allclose(stable_log_jacobian(tf.constant(u)).numpy(), naive, rtol=1e-9)
    # float32, far out: the naive form underflows to log(0), the stable one is exact.
    big = np.array([-30.0, -12.0, 12.0, 30.0], np.float32)
    with np.errstate(divide="ignore"):
        naive32 = np.log(np.float32(1) - np.tanh(big) ** 2)
    assert np.isinf(naive32).all()
    exact = -2.0 * np.log(np.cosh(big.astype(np.float64)))  # 1 - tanh^2 = 1 / cosh^2
    stable32 = stable_log_jacobian(tf.constant(big)).numpy()
    assert np.isfinite(stable32).all()
    np.testing.assert_allclose(stable32, exact, rtol=1e-6)


# --- independent numpy reference (float64) ------------------------------------------------


def torso(p: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    return np.tanh(x @ p[f"{prefix}/torso/0/w"] + p[f"{prefix}/torso/0/b"])


def policy(p: dict, obs: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a = tanh(mean + std * z) and log pi(a|s), the naive formula (fine for moderate u)."""
    h = torso(p, "actor", obs)
    mean = h @ p["actor/mean/w"] + p["actor/mean/b"]
    raw = np.tanh(h @ p["actor/log_std/w"] + p["actor/log_std/b"])
    log_std = LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) * (raw + 1) / 2
    u = mean + np.exp(log_std) * z
    logp = -0.5 * z**2 - log_std - 0.5 * LOG_2PI - np.log(1 - np.tanh(u) ** 2)
    return np.tanh(u), logp.sum(axis=1)


def critic(p: dict, q: str, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    h = torso(p, f"critic/{q}", np.concatenate([obs, action], axis=1))
    return (h @ p[f"critic/{q}/out/w"] + p[f"critic/{q}/out/b"])[:, 0]


def min_q(p: dict, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    return np.minimum(critic(p, "q1", obs, action), critic(p, "q2", obs, action))


def reference(online, target, target_entropy=-2.0, weights=WEIGHTS) -> dict:
    obs, action, reward = f64(OBS), f64(ACTION), f64(REWARD)
    next_obs, discount, weights, noise = f64(NEXT_OBS), f64(DISCOUNT), f64(weights), f64(NOISE)
    log_alpha = online["alpha/log_alpha"]
    alpha = np.exp(log_alpha)
    next_action, next_logp = policy(online, next_obs, noise[0])
    y = reward + discount * (min_q(target, next_obs, next_action) - alpha * next_logp)
    qs = [critic(online, q, obs, action) for q in ("q1", "q2")]
    new_action, logp = policy(online, obs, noise[1])
    return {
        "y": y,
        "td": y - qs[0],
        "q_mean": qs[0].mean(),
        "critic_loss": sum(np.mean(weights * (q - y) ** 2) for q in qs),
        "actor_loss": np.mean(alpha * logp - min_q(online, obs, new_action)),
        "alpha_loss": -np.mean(log_alpha * (logp + target_entropy)),
        "alpha": alpha,
        "entropy": -np.mean(logp),
        "new_action": new_action,
        "logp": logp,
    }


def finite_difference(online, target, loss: str, prefix: str) -> dict:
    """d reference[loss] / d online variable, central differences, for names under prefix."""
    names = [n for n in online if n.startswith(prefix)]
    return central_differences(online, lambda p: reference(p, target)[loss], names)


# --- the losses ---------------------------------------------------------------------------


def test_learn_matches_reference():
    algo, online, target = setup()
    ref = reference(online, target)
    assert algo.target_entropy == -2.0  # None: -|A|

    grads, stats, priorities = algo.learn(
        make_batch(), np.array(WEIGHTS, np.float32), np.array(NOISE, np.float32)
    )

    for key in ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    np.testing.assert_allclose(priorities, np.abs(ref["td"]), rtol=1e-5)
    np.testing.assert_allclose(algo.targets(make_batch(), NOISE[0]), ref["y"], rtol=1e-5, atol=1e-6)
    action, logp = algo.sample(OBS, NOISE[1])
    np.testing.assert_allclose(action, ref["new_action"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp, ref["logp"], rtol=1e-5, atol=1e-5)
    expected = {
        **finite_difference(online, target, "critic_loss", "critic/"),
        **finite_difference(online, target, "actor_loss", "actor/"),
        **finite_difference(online, target, "alpha_loss", "alpha/"),
    }
    assert list(algo.variables) == sorted(expected)
    for grad, name in zip(grads, algo.variables, strict=True):
        assert np.shape(grad) == expected[name].shape, name
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # The temperature's gradient in closed form: -mean(log pi + target_entropy).
    alpha_grad = dict(zip(algo.variables, grads, strict=True))["alpha/log_alpha"]
    assert alpha_grad == pytest.approx(-np.mean(ref["logp"] - 2.0), rel=1e-5)
    for name, var in algo.variables.items():  # learning moves nothing (the PS does)
        np.testing.assert_array_equal(var.numpy(), online[name].astype(np.float32))


def test_importance_weights_scale_the_critic_loss_only():
    algo, _, _ = setup()
    noise = np.array(NOISE, np.float32)
    ones = algo.learn(make_batch(), np.ones(5, np.float32), noise)
    doubled = algo.learn(make_batch(), np.full(5, 2.0, np.float32), noise)
    assert doubled[1]["critic_loss"] == pytest.approx(2 * ones[1]["critic_loss"], rel=1e-5)
    assert doubled[1]["actor_loss"] == pytest.approx(ones[1]["actor_loss"], rel=1e-6)
    for name, a, b in zip(algo.variables, ones[0], doubled[0], strict=True):
        factor = 2.0 if name.startswith("critic/") else 1.0
        np.testing.assert_allclose(b, factor * a, rtol=1e-5, atol=1e-7, err_msg=name)


def test_without_autotune_alpha_gets_no_gradient():
    algo = build(autotune_alpha=False, initial_alpha=0.2)
    grads, stats, _ = algo.learn(make_batch(), None)
    named = dict(zip(algo.variables, grads, strict=True))
    assert named["alpha/log_alpha"] is None
    assert all(g is not None for n, g in named.items() if n != "alpha/log_alpha")
    assert stats["alpha"] == pytest.approx(0.2, rel=1e-6)


@pytest.mark.parametrize("target_entropy, grows", [(3.0, True), (-20.0, False)])
def test_temperature_moves_towards_the_target_entropy(target_entropy, grows):
    """Entropy below the target: alpha grows; above it: alpha shrinks (plain SGD steps)."""
    algo = build(target_entropy=target_entropy)
    rng = np.random.default_rng(0)
    batch = make_batch()
    alphas = []
    for _ in range(4):
        noise = rng.standard_normal((2, 5, 2)).astype(np.float32)
        grads, stats, _ = algo.learn(batch, None, noise)
        assert (stats["entropy"] < target_entropy) == grows
        grad = dict(zip(algo.variables, grads, strict=True))["alpha/log_alpha"]
        # d alpha_loss / d log_alpha = -mean(log pi + H_target) = entropy - H_target.
        assert grad == pytest.approx(stats["entropy"] - target_entropy, rel=1e-5)
        alphas.append(stats["alpha"])
        algo.log_alpha.assign_sub(0.1 * grad)
    assert alphas[0] == pytest.approx(1.0)
    steps = np.diff(alphas)
    assert (steps > 0).all() if grows else (steps < 0).all()


# --- hooks --------------------------------------------------------------------------------


def test_variables_replay_spec_and_hooks():
    algo = build()
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "actor/log_std/b": (2,),
        "actor/log_std/w": (3, 2),
        "actor/mean/b": (2,),
        "actor/mean/w": (3, 2),
        "actor/torso/0/b": (3,),
        "actor/torso/0/w": (3, 3),
        "alpha/log_alpha": (),
        **{f"critic/{q}/out/b": (1,) for q in ("q1", "q2")},
        **{f"critic/{q}/out/w": (3, 1) for q in ("q1", "q2")},
        **{f"critic/{q}/torso/0/b": (3,) for q in ("q1", "q2")},
        **{f"critic/{q}/torso/0/w": (5, 3) for q in ("q1", "q2")},
    }
    assert list(algo.variables) == sorted(algo.variables)
    assert set(target_variables(algo)) == {
        f"target_{n}" for n in algo.variables if n.startswith("critic/")
    }
    assert algo.target_update_period == 1 and sac.SPEC.flow == "async_replay"
    assert sac.SPEC.replay_kinds == ("uniform", "prioritized")
    assert sac.replay_spec(Params(), OBS_SPACE, ACTION_SPACE) == {
        "obs": ((3,), np.dtype(np.float32)),
        "action": ((2,), np.dtype(np.float32)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": ((3,), np.dtype(np.float32)),
        "discount": ((), np.dtype(np.float32)),
    }
    assert build(initial_alpha=0.5).log_alpha.numpy() == pytest.approx(math.log(0.5))


def test_polyak_on_known_numbers():
    tau = 0.1
    algo, online, target = setup(tau=tau)
    targets = target_variables(algo)
    algo.sync_target()  # the first call copies (the learner calls it right after its pull)
    for name, var in targets.items():
        np.testing.assert_array_equal(var.numpy(), algo.variables[name[7:]].numpy())
    set_networks(algo, online, target)
    algo.sync_target()
    for name, var in targets.items():
        online_name = name.removeprefix("target_")
        expected = tau * online[online_name] + (1 - tau) * target[online_name]
        np.testing.assert_allclose(var.numpy(), expected, atol=1e-6)
    # By hand: 0.1 * online + 0.9 * target for one weight.
    w = "critic/q1/out/w"
    value = targets[f"target_{w}"].numpy()[0, 0]
    assert value == pytest.approx(0.1 * online[w][0, 0] + 0.9 * target[w][0, 0], abs=1e-6)


def test_initial_priorities_use_the_online_critics():
    algo, online, _ = setup()
    priorities = algo.initial_priorities(make_batch(), NOISE[0])
    assert priorities.shape == (5,) and np.all(np.isfinite(priorities))
    as_target = reference(online, online)  # the online critics stand in for the targets
    np.testing.assert_allclose(priorities, np.abs(as_target["td"]), rtol=1e-5)
    drawn = algo.initial_priorities(make_batch())
    assert drawn.shape == (5,) and np.all(np.isfinite(drawn))


def test_collector_on_pendulum():
    env = make_vector_env("Pendulum-v1", 3, vector="sync", seed=0, max_episode_steps=3)
    params = Params(random_steps=3, gamma=0.9)
    algo = sac.build(params, env.single_observation_space, env.single_action_space, MODEL)
    spec = sac.replay_spec(params, env.single_observation_space, env.single_action_space)
    collector = algo.collector(3, seed=0, actor_index=1, num_actors=2)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    for step in range(4):
        assert collector.stats() == {"random_actions": float(step == 0)}
        actions = collector.act(obs, rng)
        assert actions.shape == (3, 1) and actions.dtype == np.float32
        assert np.all(np.abs(actions) <= 2.0)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        out = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        assert {k: (v.shape[1:], v.dtype) for k, v in out.items()} == spec
        np.testing.assert_array_equal(out["obs"], obs)
        assert np.all(np.abs(out["action"]) <= 1.0)
        np.testing.assert_allclose(algo.scale(out["action"]), actions, atol=1e-6)
        np.testing.assert_array_equal(out["next_obs"], real_next)
        obs = next_obs
    # Stochastic for training, deterministic tanh(mean) for evaluation.
    first = collector.act(obs, np.random.default_rng(1))
    again = collector.act(obs, np.random.default_rng(1))
    other = collector.act(obs, np.random.default_rng(2))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    mean = np.tanh(algo.actor(tf.constant(obs))[0].numpy())
    np.testing.assert_allclose(algo.greedy(obs), scale_actions(mean, [-2.0], [2.0]), rtol=1e-6)
    grads, stats, priorities = algo.learn(out, None)
    assert priorities.shape == (3,) and all(np.isfinite(v) for v in stats.values())


# --- config checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"gamma": -0.1},
        {"gamma": float("nan")},
        {"n_step": 0},
        {"batch_size": 0},
        {"actor_lr": 0.0},
        {"critic_lr": -1.0},
        {"alpha_lr": 0.0},
        {"optimizer": "adagrad"},
        {"tau": 0.0},
        {"initial_alpha": 0.0},
        {"initial_alpha": float("inf")},
        {"target_entropy": float("nan")},
        {"random_steps": -1},
        {"grad_clip": -0.5},
        {"max_staleness": -1},
    ],
    ids=lambda change: next(iter(change)),
)
def test_params_are_checked(change):
    name, value = next(iter(change.items()))
    with pytest.raises(ConfigError, match=rf"^sac: {name} must be"):
        Params(**{name: value})


@pytest.mark.parametrize(
    "obs_space, action_space, model, match",
    [
        (OBS_SPACE, gym.spaces.Discrete(3), MODEL, "flat Box action"),
        (OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, shape=(2,)), MODEL, "finite Box action"),
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), ACTION_SPACE, MODEL, "flat Box obs"),
        (OBS_SPACE, ACTION_SPACE, ModelConfig(kind="conv"), "model.kind mlp or custom"),
    ],
    ids=["discrete", "unbounded", "image", "conv"],
)
def test_build_refuses_unsupported_setups(obs_space, action_space, model, match):
    with pytest.raises(ConfigError, match=f"^(model.kind: )?sac .*{match}"):
        sac.build(Params(), obs_space, action_space, model)


@pytest.mark.parametrize("autotune", [True, False])
def test_a_fused_step_gives_what_learn_apply_and_sync_target_give_one_after_the_other(autotune):
    """`fuse_update` (a learner that applies its own updates): one compiled call per update
    gives the values, optimizer state and target critics that `learn`, the learner's
    `LocalOptimizer.apply` and `sync_target` give as three calls, alpha left alone unless
    tuned; the learner's `apply` does not step again. A non-finite update is dropped in both
    (the targets still take their Polyak step, as the learner's loop does)."""
    spec = {p: OptimizerSpec(kind="adam", lr=0.01) for p in ("actor/", "critic/", "alpha/")}
    separate, fused = (build(autotune_alpha=autotune, tau=0.1) for _ in range(2))
    apart, together = (
        LocalOptimizer(spec, separate.variables),
        LocalOptimizer(spec, fused.variables),
    )
    separate.sync_target()
    fused.sync_target()  # the learner's first call copies, before it fuses
    assert fused.fuse_update(together)  # the targets are stepped in the step: True
    noise = np.array(NOISE, np.float32)
    weights = np.array(WEIGHTS, np.float32)
    for batch in [make_batch()] * 3 + [dict(make_batch(), reward=np.full(5, np.nan, np.float32))]:
        finite = bool(np.isfinite(batch["reward"]).all())
        step = separate.learn(batch, weights, noise)
        assert step.grads.applied is None and apart.apply(step.grads) is finite
        separate.sync_target()
        fused_step = fused.learn(batch, weights, noise)
        assert bool(fused_step.grads.applied) is finite
        assert together.apply(fused_step.grads) is finite  # answered, not applied again
        np.testing.assert_allclose(fused_step.grads.tensor, step.grads.tensor, rtol=1e-6)
    names = list(separate.variables)
    for name in names:
        np.testing.assert_allclose(
            fused.variables[name].numpy(), separate.variables[name].numpy(), rtol=1e-6, atol=1e-7
        )
    assert bool(separate.log_alpha.numpy() != 0.0) is autotune  # log(initial_alpha = 1)
    for name, target in target_variables(fused).items():
        np.testing.assert_allclose(
            target.numpy(), target_variables(separate)[name].numpy(), rtol=1e-6, atol=1e-7
        )
    for key, value in together.state(names).items():
        np.testing.assert_allclose(value, apart.state(names)[key], rtol=1e-6, atol=1e-7)
    assert together.state(names)["critic/step"] == 3
    with pytest.raises(ValueError, match="already"):
        fused.fuse_update(together)
