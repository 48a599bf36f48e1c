"""Tests of easyrl.algorithms.td3 and .ddpg: target policy smoothing, clipped double-Q targets
and the losses and gradients against an independent float64 numpy computation, delayed actor
updates, Polyak targets, exploration noise (Ape-X scales, OU statistics), action scaling, the
collector on Pendulum, initial priorities and the config checks."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from numeric import central_differences

from easyrl.algorithms import ddpg, sac, td3
from easyrl.algorithms.continuous import scale_actions
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.algorithms.td3 import Params, actor_noise_scale
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import ConfigError, EasyRLError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Box(
    np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32), dtype=np.float32
)
MODEL = ModelConfig(hidden=(3,), activation="tanh")  # smooth: finite differences are exact

OBS = [[1.0, 0.5, -0.5], [-1.0, 1.5, 0.5], [0.3, -0.7, 1.2], [0.8, 1.0, -0.2], [0.0, 2.0, 1.0]]
NEXT_OBS = [[0.8, 1.0, -0.2], [0.0, 2.0, 1.0], [1.5, -1.0, 0.6], [-0.4, 0.2, 0.9], [1.1, 0.3, 0.0]]
ACTION = [[0.5, -0.2], [-0.9, 0.3], [0.1, 0.8], [-0.3, -0.6], [0.95, 0.0]]
REWARD = [1.0, -2.0, 0.3, 0.5, -0.4]
DISCOUNT = [0.9, 0.0, 0.81, 0.9, 0.9]  # the second transition ends its episode
WEIGHTS = [1.0, 0.5, 2.0, 1.5, 0.25]
ONLINE_SEED, TARGET_SEED = 1, 7  # seeds of known_values; with 7 the twin-min picks both critics
NOISE = [[0.3, -0.1], [1.2, 4.0], [-5.0, 0.2], [0.0, -0.4], [0.7, 2.5]]  # standard normal


def f64(x) -> np.ndarray:
    """What the module sees: the float32 value, as float64 for the reference."""
    return np.asarray(x, np.float32).astype(np.float64)


def make_batch() -> dict:
    return {
        "obs": np.array(OBS, np.float32),
        "action": np.array(ACTION, np.float32),
        "reward": np.array(REWARD, np.float32),
        "next_obs": np.array(NEXT_OBS, np.float32),
        "discount": np.array(DISCOUNT, np.float32),
    }


def build(algo=td3, **changes):
    return algo.build(algo.Params(**changes), OBS_SPACE, ACTION_SPACE, MODEL, seed=3)


def known_values(algo, seed: int) -> dict[str, np.ndarray]:
    """Values for every online variable, rounded to 0.01, from a seeded stream."""
    rng = np.random.default_rng(seed)
    return {
        name: f64(np.round(rng.uniform(-0.9, 0.9, size=var.shape), 2))
        for name, var in algo.variables.items()
    }


def target_variables(algo) -> dict:
    return {dst.name.removesuffix(":0"): dst for _, dst in algo.polyak.pairs}


def set_networks(algo, online: dict, target: dict) -> None:
    """Sets the online variables to `online` and their targets to `target` (same keys)."""
    for name, var in algo.variables.items():
        var.assign(online[name].astype(np.float32))
    targets = target_variables(algo)
    assert set(targets) == {f"target_{n}" for n in online}
    for name, value in target.items():
        targets[f"target_{name}"].assign(value.astype(np.float32))


# --- independent numpy reference (float64) ------------------------------------------------


def mlp(p: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    h = np.tanh(x @ p[f"{prefix}/torso/0/w"] + p[f"{prefix}/torso/0/b"])
    return h @ p[f"{prefix}/out/w"] + p[f"{prefix}/out/b"]


def actor(p: dict, obs: np.ndarray) -> np.ndarray:
    return np.tanh(mlp(p, "actor", obs))  # [B, A]


def critic(p: dict, q: str, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    return mlp(p, f"critic/{q}", np.concatenate([obs, action], axis=1))[:, 0]  # [B]


def reference(online, target, twin, sigma=0.2, clip=0.5, noise=NOISE, weights=WEIGHTS) -> dict:
    obs, action, reward = f64(OBS), f64(ACTION), f64(REWARD)
    next_obs, discount, weights = f64(NEXT_OBS), f64(DISCOUNT), f64(weights)
    names = ["q1", "q2"] if twin else ["q1"]
    eps = np.clip(sigma * f64(noise), -clip, clip)
    next_action = np.clip(actor(target, next_obs) + eps, -1.0, 1.0)
    next_qs = np.array([critic(target, q, next_obs, next_action) for q in names])  # [n, B]
    y = reward + discount * next_qs.min(axis=0)
    qs = [critic(online, q, obs, action) for q in names]
    return {
        "next_action": next_action,
        "next_qs": next_qs,
        "y": y,
        "td": y - qs[0],
        "q_mean": qs[0].mean(),
        "critic_loss": sum(np.mean(weights * (q - y) ** 2) for q in qs),
        "actor_loss": -np.mean(critic(online, "q1", obs, actor(online, obs))),
    }


def finite_difference(online, target, twin, loss: str, prefix: str) -> dict:
    """d reference[loss] / d online variable, central differences, for names under prefix."""
    names = [n for n in online if n.startswith(prefix)]
    return central_differences(online, lambda p: reference(p, target, twin)[loss], names)


# --- the losses ---------------------------------------------------------------------------


@pytest.mark.parametrize("twin", [True, False], ids=["twin", "single"])
def test_learn_matches_reference(twin):
    algo = build(twin_q=twin, policy_delay=1)
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    ref = reference(online, target, twin)
    if twin:  # the min picks each critic somewhere: the twin-min matters
        assert (ref["next_qs"][0] < ref["next_qs"][1]).any()
        assert (ref["next_qs"][1] < ref["next_qs"][0]).any()

    grads, stats, priorities = algo.learn(
        make_batch(), np.array(WEIGHTS, np.float32), np.array(NOISE, np.float32)
    )

    assert stats["critic_loss"] == pytest.approx(ref["critic_loss"], rel=1e-5)
    assert stats["actor_loss"] == pytest.approx(ref["actor_loss"], rel=1e-5)
    assert stats["q_mean"] == pytest.approx(ref["q_mean"], rel=1e-5)
    np.testing.assert_allclose(priorities, np.abs(ref["td"]), rtol=1e-5)
    expected = {
        **finite_difference(online, target, twin, "critic_loss", "critic/"),
        **finite_difference(online, target, twin, "actor_loss", "actor/"),
    }
    assert list(algo.variables) == sorted(expected)
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # Learning does not touch the variables (the PS applies the gradients).
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), online[name].astype(np.float32))


def test_twin_min_target_against_numpy():
    algo = build()
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    ref = reference(online, target, twin=True)
    np.testing.assert_allclose(algo.targets(make_batch(), NOISE), ref["y"], rtol=1e-5, atol=1e-6)
    # Neither critic alone gives the target.
    for q in range(2):
        alone = f64(REWARD) + f64(DISCOUNT) * ref["next_qs"][q]
        assert not np.allclose(alone, ref["y"], atol=1e-3)


def test_target_policy_smoothing_clips_noise_and_actions():
    algo = build(target_noise=0.2, target_noise_clip=0.5)
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    target["actor/out/b"] = np.array([1.5, -1.5])  # mu' near +-0.9: the action clip bites
    set_networks(algo, online, target)
    next_obs = np.array(NEXT_OBS, np.float32)
    mu = actor(target, f64(NEXT_OBS))
    assert (mu[:, 0] > 0.6).all() and (mu[:, 1] < -0.6).all()

    up = algo.target_actions(next_obs, np.full((5, 2), 100.0))  # noise clipped to +0.5
    np.testing.assert_allclose(up[:, 0], 1.0)  # mu' + 0.5 > 1: clipped to the bound
    np.testing.assert_allclose(up[:, 1], mu[:, 1] + 0.5, rtol=1e-5)
    down = algo.target_actions(next_obs, np.full((5, 2), -100.0))
    np.testing.assert_allclose(down[:, 0], mu[:, 0] - 0.5, rtol=1e-5)
    np.testing.assert_allclose(down[:, 1], -1.0)
    small = algo.target_actions(next_obs, np.full((5, 2), 0.3))  # 0.2 * 0.3 < 0.5: unclipped
    np.testing.assert_allclose(small, np.clip(mu + 0.06, -1, 1), rtol=1e-5)
    # The same a' feed the target (and, through it, the loss).
    ref = reference(online, target, twin=True, noise=np.full((5, 2), 100.0))
    np.testing.assert_allclose(ref["next_action"], up, rtol=1e-5)
    y = algo.targets(make_batch(), np.full((5, 2), 100.0))
    np.testing.assert_allclose(y, ref["y"], rtol=1e-5, atol=1e-6)


def test_ddpg_target_and_loss_against_numpy():
    algo = build(ddpg)
    assert not any(n.startswith("critic/q2") for n in algo.variables)
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    huge = np.full((5, 2), 100.0, np.float32)  # no smoothing: the noise must not matter
    grads, stats, priorities = algo.learn(make_batch(), np.array(WEIGHTS, np.float32), huge)
    # Plain DDPG: y = r + discount * Q'(s', mu'(s')).
    next_obs = f64(NEXT_OBS)
    y = f64(REWARD) + f64(DISCOUNT) * critic(target, "q1", next_obs, actor(target, next_obs))
    np.testing.assert_allclose(algo.targets(make_batch(), huge), y, rtol=1e-5, atol=1e-6)
    q = critic(online, "q1", f64(OBS), f64(ACTION))
    np.testing.assert_allclose(priorities, np.abs(y - q), rtol=1e-5)
    assert stats["critic_loss"] == pytest.approx(np.mean(f64(WEIGHTS) * (q - y) ** 2), rel=1e-5)
    ref = reference(online, target, twin=False, sigma=0.0)
    assert stats["actor_loss"] == pytest.approx(ref["actor_loss"], rel=1e-5)
    assert all(g is not None for g in grads)  # delay 1: the actor moves every step
    assert stats["actor_updates"] == stats["critic_updates"] == 1.0


def test_delayed_actor_updates():
    algo = build(policy_delay=3)
    actor_names = [n for n in algo.variables if n.startswith("actor/")]
    assert actor_names
    with_actor = []
    for call in range(1, 7):
        grads, stats, _ = algo.learn(make_batch(), np.ones(5, np.float32))
        named = dict(zip(algo.variables, grads, strict=True))
        assert all(named[n] is not None for n in algo.variables if n.startswith("critic/"))
        present = [named[n] is not None for n in actor_names]
        assert all(present) or not any(present)
        assert ("actor_loss" in stats) == all(present)
        if all(present):
            with_actor.append(call)
        assert stats["critic_updates"] == float(call)
    assert with_actor == [3, 6]  # calls d, 2d, counted from 1
    assert stats["actor_updates"] == 2.0 and stats["critic_updates"] == 6.0


def test_importance_weights_scale_the_critic_loss_only():
    algo = build(policy_delay=1)
    noise = np.array(NOISE, np.float32)
    ones = algo.learn(make_batch(), np.ones(5, np.float32), noise)
    doubled = algo.learn(make_batch(), np.full(5, 2.0, np.float32), noise)
    assert doubled[1]["critic_loss"] == pytest.approx(2 * ones[1]["critic_loss"], rel=1e-5)
    assert doubled[1]["actor_loss"] == pytest.approx(ones[1]["actor_loss"], rel=1e-6)
    for name, a, b in zip(algo.variables, ones[0], doubled[0], strict=True):
        factor = 2.0 if name.startswith("critic/") else 1.0
        np.testing.assert_allclose(b, factor * a, rtol=1e-5, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(ones[2], doubled[2], rtol=1e-6)


def test_gradient_clipping_per_group():
    clip = 1e-3
    algo = build(policy_delay=1, grad_clip=clip)
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    grads = algo.learn(make_batch(), np.array(WEIGHTS, np.float32), np.array(NOISE, np.float32))[0]
    named = dict(zip(algo.variables, grads, strict=True))
    for prefix in ("actor/", "critic/"):
        expected = finite_difference(online, target, True, f"{prefix[:-1]}_loss", prefix)
        raw = np.sqrt(sum(np.sum(g**2) for g in expected.values()))
        assert raw > 10 * clip
        for name, grad in expected.items():
            np.testing.assert_allclose(named[name], grad * clip / raw, rtol=1e-4, atol=1e-9)


# --- targets ------------------------------------------------------------------------------


def test_polyak_on_known_numbers():
    tau = 0.25
    algo = build(tau=tau)
    targets = target_variables(algo)
    # Built and after the first sync: the targets are copies of the online networks.
    algo.sync_target()
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(targets[f"target_{name}"].numpy(), var.numpy())
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    algo.sync_target()
    for name in online:
        expected = tau * online[name] + (1 - tau) * target[name]
        np.testing.assert_allclose(targets[f"target_{name}"].numpy(), expected, atol=1e-6)
    algo.sync_target()
    for name in online:
        expected = online[name] + (1 - tau) ** 2 * (target[name] - online[name])
        np.testing.assert_allclose(targets[f"target_{name}"].numpy(), expected, atol=1e-6)
    # One hand-checked number: 0.25 * a + 0.75 * b.
    name = "critic/q2/out/b"
    a, b = online[name][0], target[name][0]
    assert targets[f"target_{name}"].numpy()[0] == pytest.approx(a + 0.5625 * (b - a), abs=1e-6)


def test_targets_are_local():
    algo = build()
    assert not any(n.startswith("target") for n in algo.variables)
    assert set(target_variables(algo)) == {f"target_{n}" for n in algo.variables}
    assert algo.target_update_period == 1


# --- exploration --------------------------------------------------------------------------


def test_per_actor_noise_scales():
    params = Params(exploration_noise=0.1, noise_alpha=3.0)
    got = [actor_noise_scale(params, i, 4) for i in range(4)]
    np.testing.assert_allclose(got, [0.1, 0.1 * 4 ** (1 / 3), 0.1 * 4 ** (2 / 3), 0.4])
    assert actor_noise_scale(params, 0, 1) == pytest.approx(0.1)
    assert actor_noise_scale(Params(exploration_noise=0.3), 5, 8) == pytest.approx(0.3)
    algo = td3.build(params, OBS_SPACE, ACTION_SPACE, MODEL)
    assert algo.collector(2, 0, 3, 4).stats()["noise_scale"] == pytest.approx(0.4)
    assert algo.collector(2, 0, 0, 4).stats()["noise_scale"] == pytest.approx(0.1)


def test_gaussian_noise_statistics():
    algo = build(exploration_noise=0.1)
    num_envs = 400
    explorer = algo.collector(num_envs).explorer
    obs = np.zeros((num_envs, 3), np.float32)
    mu = algo.policy(obs)
    assert np.abs(mu).max() < 0.3  # no clipping below
    rng = np.random.default_rng(0)
    noise = np.array([explorer(obs, rng) - mu for _ in range(30)])  # [T, N, A]
    assert noise.std() == pytest.approx(0.1, rel=0.03)
    assert abs(noise.mean()) < 0.005
    lag1 = np.mean(noise[1:] * noise[:-1]) / noise.var()
    assert abs(lag1) < 0.03  # independent across steps


def test_ou_noise_mean_reversion_and_stationary_statistics():
    theta, sigma = 0.15, 0.05
    algo = build(exploration="ou", exploration_noise=sigma, ou_theta=theta)
    num_envs = 400
    explorer = algo.collector(num_envs).explorer
    obs = np.zeros((num_envs, 3), np.float32)
    mu = algo.policy(obs)
    rng = np.random.default_rng(1)
    # Mean reversion: from 0.5 the mean decays as 0.5 * (1 - theta)^t.
    explorer.ou_state[:] = 0.5
    for t in range(1, 11):
        actions = explorer(obs, rng)
        np.testing.assert_allclose(actions, np.clip(mu + explorer.ou_state, -1, 1), rtol=1e-6)
        assert explorer.ou_state.mean() == pytest.approx(0.5 * (1 - theta) ** t, abs=0.005)
    # Stationary: var = sigma^2 / (1 - (1 - theta)^2), lag-1 autocorrelation 1 - theta.
    explorer.reset(np.ones(num_envs, bool))
    assert not explorer.ou_state.any()
    states = []
    for _ in range(80):
        explorer(obs, rng)
        states.append(explorer.ou_state.copy())
    states = np.array(states[40:])  # [T, N, A]
    assert states.std() == pytest.approx(sigma / np.sqrt(1 - (1 - theta) ** 2), rel=0.05)
    lag1 = np.mean(states[1:] * states[:-1]) / np.mean(states**2)
    assert lag1 == pytest.approx(1 - theta, abs=0.03)
    # An episode end restarts that env's process only.
    done = np.zeros(num_envs, bool)
    done[:3] = True
    explorer.reset(done)
    assert not explorer.ou_state[:3].any() and explorer.ou_state[3:].any()


def test_action_scaling_to_bounds():
    box = gym.spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)
    normalized = np.array([[-1.0], [-0.5], [0.0], [0.5], [1.0], [1.7], [-3.0]])
    scaled = scale_actions(normalized, box.low, box.high)
    np.testing.assert_allclose(scaled[:, 0], [-2.0, -1.0, 0.0, 1.0, 2.0, 2.0, -2.0])
    assert scaled.dtype == np.float32
    asym = scale_actions(
        [[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]], ACTION_SPACE.low, ACTION_SPACE.high
    )
    np.testing.assert_allclose(asym, [[-2.0, 0.0], [0.0, 0.5], [2.0, 1.0]])
    algo = build()
    obs = np.array(OBS, np.float32)
    np.testing.assert_allclose(algo.greedy(obs), scale_actions(algo.policy(obs), [-2, 0], [2, 1]))
    assert all(ACTION_SPACE.contains(a) for a in algo.greedy(obs))


# --- actor side ---------------------------------------------------------------------------


def test_collector_on_pendulum():
    env = make_vector_env("Pendulum-v1", 3, vector="sync", seed=0, max_episode_steps=4)
    params = Params(exploration="ou", exploration_noise=0.5, random_steps=6, gamma=0.9)
    algo = td3.build(params, env.single_observation_space, env.single_action_space, MODEL)
    spec = td3.replay_spec(params, env.single_observation_space, env.single_action_space)
    collector = algo.collector(3, seed=0, actor_index=0, num_actors=1)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    with pytest.raises(EasyRLError, match="act"):
        collector.observe(np.zeros(3), obs, obs, np.zeros(3, bool), np.zeros(3, bool))
    for step in range(6):
        assert collector.stats()["random_actions"] == float(step < 2)
        actions = collector.act(obs, rng)
        assert actions.shape == (3, 1) and actions.dtype == np.float32
        assert np.all(np.abs(actions) <= 2.0)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        assert done.all() == (step == 3)  # the 4-step limit truncates every env at once
        real_next = final_observations(next_obs, infos, done)
        out = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        assert {k: (v.shape[1:], v.dtype) for k, v in out.items()} == spec
        np.testing.assert_array_equal(out["obs"], obs)
        assert np.all(np.abs(out["action"]) <= 1.0)
        np.testing.assert_allclose(algo.scale(out["action"]), actions, atol=1e-6)
        np.testing.assert_allclose(out["reward"], rewards, rtol=1e-6)
        np.testing.assert_array_equal(out["next_obs"], real_next)
        np.testing.assert_allclose(out["discount"], 0.9)  # truncation still bootstraps
        if step == 3:
            assert not np.array_equal(real_next, next_obs)
            assert not collector.explorer.ou_state.any()  # OU restarted with the episodes
        obs = next_obs
    grads, stats, priorities = algo.learn(out, None)
    assert priorities.shape == (3,) and np.isfinite(stats["critic_loss"])


def test_initial_priorities_use_the_online_networks():
    algo = build()
    online, target = known_values(algo, ONLINE_SEED), known_values(algo, TARGET_SEED)
    set_networks(algo, online, target)
    priorities = algo.initial_priorities(make_batch())
    assert priorities.shape == (5,) and priorities.dtype == np.float32
    assert np.all(np.isfinite(priorities))
    next_obs = f64(NEXT_OBS)
    next_action = actor(online, next_obs)
    bootstrap = np.minimum(
        critic(online, "q1", next_obs, next_action), critic(online, "q2", next_obs, next_action)
    )
    y = f64(REWARD) + f64(DISCOUNT) * bootstrap
    expected = np.abs(y - critic(online, "q1", f64(OBS), f64(ACTION)))
    np.testing.assert_allclose(priorities, expected, rtol=1e-5)


# --- hooks, params, config checks ---------------------------------------------------------


@pytest.mark.parametrize(
    "algo, lrs",
    [(td3, {}), (ddpg, {}), (sac, {"alpha": 5e-3})],
    ids=["td3", "ddpg", "sac"],
)
def test_optimizer_groups_cover_every_variable_once(algo, lrs):
    lrs = {"actor": 1e-4, "critic": 2e-3, **lrs}  # SAC's temperature has its own group
    params = algo.Params(optimizer="rmsprop", **{f"{k}_lr": lr for k, lr in lrs.items()})
    groups = algo.optimizer(params)
    assert groups == {f"{k}/": OptimizerSpec(kind="rmsprop", lr=lr) for k, lr in lrs.items()}
    variables = algo.build(params, OBS_SPACE, ACTION_SPACE, MODEL).variables
    for name in variables:
        assert sum(name.startswith(prefix) for prefix in groups) == 1, name
    assert {p for p in groups if any(n.startswith(p) for n in variables)} == set(groups)


def test_replay_spec_and_variable_names():
    spec = td3.replay_spec(Params(), OBS_SPACE, ACTION_SPACE)
    assert spec == {
        "obs": ((3,), np.dtype(np.float32)),
        "action": ((2,), np.dtype(np.float32)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": ((3,), np.dtype(np.float32)),
        "discount": ((), np.dtype(np.float32)),
    }
    assert ddpg.replay_spec(ddpg.Params(), OBS_SPACE, ACTION_SPACE) == spec
    assert (td3.SPEC.flow, ddpg.SPEC.flow) == ("async_replay", "async_replay")
    assert td3.SPEC.replay_kinds == ddpg.SPEC.replay_kinds == ("uniform", "prioritized")
    algo = build()
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "actor/out/b": (2,),
        "actor/out/w": (3, 2),
        "actor/torso/0/b": (3,),
        "actor/torso/0/w": (3, 3),
        **{f"critic/{q}/out/b": (1,) for q in ("q1", "q2")},
        **{f"critic/{q}/out/w": (3, 1) for q in ("q1", "q2")},
        **{f"critic/{q}/torso/0/b": (3,) for q in ("q1", "q2")},
        **{f"critic/{q}/torso/0/w": (5, 3) for q in ("q1", "q2")},
    }
    assert list(algo.variables) == sorted(algo.variables)
    same = build()
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), same.variables[name].numpy())


def test_ddpg_params_mirror_td3():
    names = [f.name for f in dataclasses.fields(td3.Params)]
    assert [f.name for f in dataclasses.fields(ddpg.Params)] == names
    plain = ddpg.Params()
    assert (plain.twin_q, plain.policy_delay, plain.target_noise) == (False, 1, 0.0)
    differing = {n for n in names if getattr(plain, n) != getattr(Params(), n)}
    assert differing == {"twin_q", "policy_delay", "target_noise"}


@pytest.mark.parametrize(
    "change",
    [
        {"gamma": 1.5},
        {"gamma": float("nan")},
        {"n_step": 0},
        {"batch_size": 0},
        {"actor_lr": 0.0},
        {"critic_lr": -1e-3},
        {"optimizer": "adagrad"},
        {"tau": 0.0},
        {"tau": 1.5},
        {"policy_delay": 0},
        {"target_noise": -0.1},
        {"target_noise_clip": -0.5},
        {"exploration": "pink"},
        {"exploration_noise": -0.1},
        {"noise_alpha": -1.0},
        {"ou_theta": 0.0},
        {"random_steps": -1},
        {"grad_clip": -1.0},
        {"max_staleness": -1},
    ],
    ids=lambda change: next(iter(change)),
)
@pytest.mark.parametrize("algo", [td3, ddpg], ids=["td3", "ddpg"])
def test_params_are_checked(algo, change):
    name, value = next(iter(change.items()))
    with pytest.raises(ConfigError, match=rf"^{algo.__name__.split('.')[-1]}: {name} must be"):
        algo.Params(**{name: value})


@pytest.mark.parametrize(
    "obs_space, action_space, model, match",
    [
        (OBS_SPACE, gym.spaces.Discrete(3), MODEL, "flat Box action"),
        (OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, shape=(2,)), MODEL, "finite Box action"),
        (OBS_SPACE, gym.spaces.Box(-1.0, 1.0, shape=(2, 2)), MODEL, "flat Box action"),
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), ACTION_SPACE, MODEL, "flat Box obs"),
        (gym.spaces.Discrete(4), ACTION_SPACE, MODEL, "flat Box obs"),
        (OBS_SPACE, ACTION_SPACE, ModelConfig(kind="conv"), "model.kind mlp or custom"),
    ],
    ids=["discrete", "unbounded", "matrix-action", "image", "discrete-obs", "conv"],
)
@pytest.mark.parametrize("algo", [td3, ddpg], ids=["td3", "ddpg"])
def test_build_refuses_unsupported_setups(algo, obs_space, action_space, model, match):
    prefix = algo.__name__.split(".")[-1]
    with pytest.raises(ConfigError, match=f"^(model.kind: )?{prefix} .*{match}"):
        algo.build(algo.Params(), obs_space, action_space, model)
    if model is MODEL:
        with pytest.raises(ConfigError, match=f"^{prefix} .*{match}"):
            algo.replay_spec(algo.Params(), obs_space, action_space)
