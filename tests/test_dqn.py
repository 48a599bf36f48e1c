"""Tests of easyrl.algorithms.dqn: exploration schedule, the DQN loss and gradients against
an independent float64 numpy computation, initial priorities, acting and build checks."""

import gymnasium as gym
import numpy as np
import pytest
from numeric import central_differences

from easyrl.algorithms import dqn, registry
from easyrl.algorithms.dqn import Params, actor_epsilon
from easyrl.algorithms.nstep import PRIORITY
from easyrl.algorithms.optimizers import LocalOptimizer, OptimizerSpec
from easyrl.config import ModelConfig
from easyrl.errors import ConfigError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
MODEL = ModelConfig(hidden=(3,), activation="relu")

# Known parameter values, by name without the network prefix ("q/" or "target/").
ONLINE = {
    "torso/0/w": [[0.5, -0.3, 0.2], [0.1, 0.4, -0.6], [-0.2, 0.3, 0.5], [0.3, -0.1, 0.2]],
    "torso/0/b": [0.1, -0.05, 0.2],
    "advantage/w": [[0.7, -0.4], [0.2, 0.5], [-0.3, 0.6]],
    "advantage/b": [0.05, -0.1],
    "value/w": [[0.4], [-0.2], [0.3]],
    "value/b": [0.1],
}
TARGET = {
    "torso/0/w": [[0.4, -0.2, 0.3], [0.2, 0.3, -0.5], [-0.1, 0.4, 0.6], [0.2, -0.2, 0.1]],
    "torso/0/b": [0.0, 0.1, 0.1],
    "advantage/w": [[-0.5, 0.6], [0.3, -0.2], [0.4, 0.1]],
    "advantage/b": [0.2, 0.0],
    "value/w": [[0.1], [0.5], [-0.3]],
    "value/b": [-0.2],
}
OBS = [[1.0, 0.5, -0.5, 2.0], [-1.0, 1.5, 0.5, 0.0], [0.3, -0.7, 1.2, 0.4]]
NEXT_OBS = [[0.8, 1.0, -0.2, 1.5], [0.0, 2.0, 1.0, -0.5], [1.5, -1.0, 0.6, 0.9]]
ACTION = [0, 1, 1]
REWARD = [1.0, -2.0, 0.3]
DISCOUNT = [0.9, 0.0, 0.81]  # the second transition ends its episode
WEIGHTS = [1.0, 0.5, 2.0]


def f32(x) -> np.ndarray:
    """What the module sees: the float32 value, as float64 for the reference."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def make_batch() -> dict:
    return {
        "obs": np.array(OBS, np.float32),
        "action": np.array(ACTION, np.int64),
        "reward": np.array(REWARD, np.float32),
        "next_obs": np.array(NEXT_OBS, np.float32),
        "discount": np.array(DISCOUNT, np.float32),
    }


def params_of(dueling: bool, values: dict) -> dict[str, np.ndarray]:
    return {k: f32(v) for k, v in values.items() if dueling or not k.startswith("value/")}


def build(**changes):
    changes.setdefault("grad_clip", 0.0)
    return dqn.build(Params(**changes), OBS_SPACE, ACTION_SPACE, MODEL, seed=3)


def set_networks(algo, dueling: bool) -> None:
    """Sets the online and target networks to ONLINE and TARGET."""
    online = params_of(dueling, ONLINE)
    assert set(algo.variables) == {f"q/{k}" for k in online}
    for name, var in algo.variables.items():
        var.assign(online[name.removeprefix("q/")].astype(np.float32))
    target = params_of(dueling, TARGET)
    target_vars = {v.name.removesuffix(":0"): v for v in algo.target.trainable_variables}
    assert set(target_vars) == {f"target/{k}" for k in target}
    for name, var in target_vars.items():
        var.assign(target[name.removeprefix("target/")].astype(np.float32))


# --- independent numpy reference (float64) ------------------------------------------------


def q_values(p: dict, obs: np.ndarray, dueling: bool) -> np.ndarray:
    """Q(s, .) = V + A - mean(A) (dueling) or A, over a relu torso."""
    pre = obs @ p["torso/0/w"] + p["torso/0/b"]
    # Finite differences need every unit away from the relu kink.
    assert np.abs(pre).min() > 0.03
    h = np.maximum(pre, 0.0)
    adv = h @ p["advantage/w"] + p["advantage/b"]
    if not dueling:
        return adv
    value = h @ p["value/w"] + p["value/b"]
    return value + adv - adv.mean(axis=1, keepdims=True)


def huber(x: np.ndarray, delta: float = 1.0) -> np.ndarray:
    return np.where(np.abs(x) <= delta, 0.5 * x**2, delta * (np.abs(x) - 0.5 * delta))


def reference(online: dict, target: dict, double_q: bool, dueling: bool) -> dict:
    obs, next_obs = f32(OBS), f32(NEXT_OBS)
    action, reward, discount, weights = np.array(ACTION), f32(REWARD), f32(DISCOUNT), f32(WEIGHTS)
    rows = np.arange(len(action))
    q_s = q_values(online, obs, dueling)
    next_online = q_values(online, next_obs, dueling)
    next_target = q_values(target, next_obs, dueling)
    best = np.argmax(next_online if double_q else next_target, axis=1)
    y = reward + discount * next_target[rows, best]
    td = y - q_s[rows, action]
    loss = np.mean(weights * huber(td))
    return {"loss": loss, "td": td, "q_sa": q_s[rows, action], "best": best}


def finite_difference_grads(dueling: bool, double_q: bool) -> dict:
    """d loss / d online parameter, central differences; the target network is fixed."""
    target = params_of(dueling, TARGET)
    grads = central_differences(
        params_of(dueling, ONLINE), lambda p: reference(p, target, double_q, dueling)["loss"]
    )
    return {f"q/{name}": grad for name, grad in grads.items()}


# --- actor_epsilon ------------------------------------------------------------------------


def test_actor_epsilon_ape_x_formula():
    params = Params(epsilon=0.4, epsilon_alpha=7.0)
    got = [actor_epsilon(params, i, 4, env_steps=10**6) for i in range(4)]
    assert got[0] == pytest.approx(0.4, rel=1e-12)
    assert got[1] == pytest.approx(0.4 ** (1 + 7 / 3), rel=1e-12)
    assert got[2] == pytest.approx(0.4 ** (1 + 14 / 3), rel=1e-12)
    assert got[3] == pytest.approx(0.4**8, rel=1e-12)
    assert got[3] == pytest.approx(0.00065536, rel=1e-9)
    assert got == sorted(got, reverse=True)


def test_actor_epsilon_single_actor_uses_base_rate():
    assert actor_epsilon(Params(epsilon=0.4), 0, 1, env_steps=0) == pytest.approx(0.4)
    assert actor_epsilon(Params(epsilon=0.1, epsilon_alpha=3.0), 0, 1, 5) == pytest.approx(0.1)


def test_actor_epsilon_linear_annealing():
    params = Params(epsilon=0.4, epsilon_alpha=7.0, epsilon_start=1.0, epsilon_anneal_steps=100)
    final = 0.4**8  # actor 3 of 4
    assert actor_epsilon(params, 3, 4, 0) == pytest.approx(1.0)
    assert actor_epsilon(params, 3, 4, 25) == pytest.approx(1.0 - 0.25 * (1.0 - final))
    assert actor_epsilon(params, 3, 4, 50) == pytest.approx(0.5 + 0.5 * final)
    assert actor_epsilon(params, 3, 4, 99) == pytest.approx(1.0 - 0.99 * (1.0 - final))
    assert actor_epsilon(params, 3, 4, 100) == pytest.approx(final)
    assert actor_epsilon(params, 3, 4, 10**7) == pytest.approx(final)
    # Actor 0 anneals to the base rate; a start below the final rate anneals upwards.
    assert actor_epsilon(params, 0, 4, 50) == pytest.approx(0.7)
    low_start = Params(epsilon=0.4, epsilon_start=0.2, epsilon_anneal_steps=10)
    assert actor_epsilon(low_start, 0, 1, 5) == pytest.approx(0.3)


def test_actor_epsilon_without_annealing_ignores_start():
    params = Params(epsilon=0.4, epsilon_start=1.0, epsilon_anneal_steps=0)
    assert actor_epsilon(params, 0, 4, 0) == pytest.approx(0.4)


# --- the loss -----------------------------------------------------------------------------


def test_reference_setup_covers_both_huber_regimes_and_double_q_matters():
    for dueling in (True, False):
        online, target = params_of(dueling, ONLINE), params_of(dueling, TARGET)
        double = reference(online, target, True, dueling)
        single = reference(online, target, False, dueling)
        for ref in (double, single):
            assert (np.abs(ref["td"]) < 0.9).any() and (np.abs(ref["td"]) > 1.1).any()
            assert np.abs(np.abs(ref["td"]) - 1.0).min() > 0.05  # away from the Huber kink
        # The online and target nets pick different next actions where it counts.
        bootstrapped = np.array(DISCOUNT) > 0
        assert (double["best"] != single["best"])[bootstrapped].any()
        assert not np.allclose(double["loss"], single["loss"], rtol=1e-3)


@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
@pytest.mark.parametrize("double_q", [True, False], ids=["double", "single"])
def test_learn_matches_hand_computation(double_q, dueling):
    algo = build(double_q=double_q, dueling=dueling)
    set_networks(algo, dueling)
    ref = reference(params_of(dueling, ONLINE), params_of(dueling, TARGET), double_q, dueling)

    grads, stats, priorities = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))

    assert stats["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    assert stats["q_mean"] == pytest.approx(np.mean(ref["q_sa"]), rel=1e-4, abs=1e-6)
    assert priorities.shape == (3,)
    np.testing.assert_allclose(priorities, np.abs(ref["td"]), rtol=1e-4)
    expected = finite_difference_grads(dueling, double_q)
    assert len(grads) == len(algo.variables)
    for grad, name in zip(grads, algo.variables, strict=True):
        assert grad.shape == expected[name].shape, name
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # Learning does not touch the variables (the PS applies the gradients).
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(
            var.numpy(), params_of(dueling, ONLINE)[name.removeprefix("q/")].astype(np.float32)
        )


def test_learn_hand_numbers_for_one_case():
    """Values written out by hand (plain heads), so a mistake shared by reference() and the
    module cannot hide."""
    algo = build(double_q=True, dueling=False)
    set_networks(algo, dueling=False)
    _, stats, priorities = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))
    # obs 0: pre = [1.35, -0.5, 0.25] -> h = [1.35, 0, 0.25];
    #   A = [0.945 - 0.075 + 0.05, -0.54 + 0.15 - 0.1] = [0.92, -0.49]; a = 0 -> Q = 0.92.
    # next 0, online: h = [1.09, 0, 0] -> A = [0.813, -0.536] -> a* = 0.
    # next 0, target: h = [0.84, 0, 0] -> A = [-0.42 + 0.2, 0.504] = [-0.22, 0.504].
    #   double Q: y = 1 + 0.9 * -0.22 = 0.802 -> td = -0.118 (plain max would give 0.504).
    # obs 1 is terminal: y = -2; h = [0, 1, 0] -> A = [0.25, 0.4]; a = 1 -> td = -2.4.
    # obs 2: h = [0.06, 0, 1.36] -> A = [-0.316, 0.692]; a = 1 -> Q = 0.692.
    # next 2, online: h = [0.9, 0, 1.58] -> A = [0.206, 0.488] -> a* = 1.
    # next 2, target: h = [0.52, 0, 1.5] -> A = [0.54, 0.462] -> y = 0.3 + 0.81 * 0.462.
    #   td = 0.67422 - 0.692 = -0.01778.
    np.testing.assert_allclose(priorities, [0.118, 2.4, 0.01778], rtol=1e-4)
    # loss = (1 * 0.5 * 0.118^2 + 0.5 * (2.4 - 0.5) + 2 * 0.5 * 0.01778^2) / 3
    assert stats["loss"] == pytest.approx((0.006962 + 0.95 + 0.00031613) / 3, rel=1e-4)
    assert stats["q_mean"] == pytest.approx((0.92 + 0.4 + 0.692) / 3, rel=1e-5)

    plain = build(double_q=False, dueling=False)
    set_networks(plain, dueling=False)
    _, _, plain_priorities = plain.learn(make_batch(), np.array(WEIGHTS, np.float32))
    # Without double Q, next 0 bootstraps from max A_target = 0.504: td = 1.4536 - 0.92;
    # next 2 from max(0.54, 0.462) = 0.54: td = 0.3 + 0.4374 - 0.692.
    np.testing.assert_allclose(plain_priorities, [0.5336, 2.4, 0.0454], rtol=1e-4)


def test_learn_uses_the_target_network():
    """After sync_target the target is the online net: the loss changes accordingly."""
    algo = build(double_q=True, dueling=True)
    set_networks(algo, dueling=True)
    before = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))[1]["loss"]
    algo.sync_target()
    for src, dst in zip(algo.q.trainable_variables, algo.target.trainable_variables, strict=True):
        np.testing.assert_array_equal(src.numpy(), dst.numpy())
    online = params_of(True, ONLINE)
    after = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))[1]["loss"]
    assert after == pytest.approx(reference(online, online, True, True)["loss"], rel=1e-4)
    assert after != pytest.approx(before, rel=1e-3)


def test_importance_weights_scale_the_loss():
    algo = build(double_q=True, dueling=True)
    set_networks(algo, dueling=True)
    batch = make_batch()
    ones = algo.learn(batch, np.ones(3, np.float32))
    doubled = algo.learn(batch, np.full(3, 2.0, np.float32))
    assert doubled[1]["loss"] == pytest.approx(2 * ones[1]["loss"], rel=1e-5)
    for a, b in zip(ones[0], doubled[0], strict=True):
        np.testing.assert_allclose(b, 2 * a, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ones[2], doubled[2], rtol=1e-6)
    zero_first = algo.learn(batch, np.array([0.0, 1.0, 1.0], np.float32))
    rest = huber(zero_first[2][1:])
    assert zero_first[1]["loss"] == pytest.approx(rest.sum() / 3, rel=1e-4)


@pytest.mark.parametrize("clip", [1e-3, 0.05])
def test_gradient_clipping_to_global_norm(clip):
    algo = build(double_q=True, dueling=True, grad_clip=clip)
    set_networks(algo, dueling=True)
    grads, stats, priorities = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))
    expected = finite_difference_grads(dueling=True, double_q=True)
    raw_norm = np.sqrt(sum(np.sum(g**2) for g in expected.values()))
    assert raw_norm > 10 * clip  # clipping is active
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    assert norm == pytest.approx(clip, rel=1e-4)
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(
            grad, expected[name] * clip / raw_norm, rtol=1e-4, atol=1e-9, err_msg=name
        )
    # Clipping touches neither the loss nor the priorities.
    ref = reference(params_of(True, ONLINE), params_of(True, TARGET), True, True)
    assert stats["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    np.testing.assert_allclose(priorities, np.abs(ref["td"]), rtol=1e-4)


def test_gradient_clip_above_the_norm_changes_nothing():
    algo = build(double_q=True, dueling=True, grad_clip=1e3)
    set_networks(algo, dueling=True)
    grads = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))[0]
    expected = finite_difference_grads(dueling=True, double_q=True)
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_huber_delta_is_used():
    algo = build(double_q=True, dueling=True, huber_delta=5.0)
    set_networks(algo, dueling=True)
    _, stats, priorities = algo.learn(make_batch(), np.array(WEIGHTS, np.float32))
    expected = np.mean(np.array(WEIGHTS) * huber(priorities.astype(np.float64), delta=5.0))
    assert (priorities < 5.0).all()  # all quadratic now
    assert stats["loss"] == pytest.approx(expected, rel=1e-4)


# --- initial priorities -------------------------------------------------------------------


@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
def test_initial_priorities_use_the_online_net_max(dueling):
    algo = build(dueling=dueling)
    set_networks(algo, dueling)
    online = params_of(dueling, ONLINE)
    q_s = q_values(online, f32(OBS), dueling)
    q_next = q_values(online, f32(NEXT_OBS), dueling)
    rows = np.arange(3)
    expected = np.abs(
        f32(REWARD) + f32(DISCOUNT) * q_next.max(axis=1) - q_s[rows, np.array(ACTION)]
    )
    priorities = algo.initial_priorities(make_batch())
    assert priorities.shape == (3,)
    np.testing.assert_allclose(priorities, expected, rtol=1e-4)
    # Not the learner's (target-network) TD: the test can tell the two apart.
    learner_td = reference(online, params_of(dueling, TARGET), True, dueling)["td"]
    assert not np.allclose(priorities, np.abs(learner_td), rtol=1e-2)


def collect(algo, steps: int, num_envs: int = 3, seed: int = 0):
    """Runs `algo`'s collector on CartPole envs cut at 12 steps (time limits and terminations
    both happen); returns (its outputs, a plain NStepAccumulator's outputs on the same steps)."""
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=12)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    collector = algo.collector(num_envs, seed, 0, 1)
    plain = algo.postprocessor(num_envs)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    outs, expected = [], []
    for _ in range(steps):
        actions = collector.act(obs, rng)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        real = next_obs.copy()
        for e in np.flatnonzero(terminated | truncated):
            real[e] = infos["final_obs"][e]
        outs.append(collector.observe(rewards, next_obs, real, terminated, truncated))
        expected.append(plain.add(obs, actions, rewards, real, terminated, truncated))
        obs = next_obs
    env.close()
    return outs, expected


@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
def test_collected_transitions_carry_the_networks_initial_priorities(dueling):
    algo = build(dueling=dueling, n_step=3, gamma=0.9)
    outs, expected = collect(algo, 60)
    # A step's transitions come out at the next step (its next observations' V is computed
    # when acting on them): the same transitions as a plain accumulator's, one step later.
    assert outs[0] is None
    kept = [(o, e) for o, e in zip(outs[1:], expected[:-1], strict=True) if e is not None]
    assert all((o is None) == (e is None) for o, e in zip(outs[1:], expected[:-1], strict=True))
    batch = {k: np.concatenate([o[k] for o, _ in kept]) for k in kept[0][0]}
    plain = {k: np.concatenate([e[k] for _, e in kept]) for k in kept[0][1]}
    assert set(batch) == {*plain, PRIORITY}
    for key, column in plain.items():
        np.testing.assert_array_equal(batch[key], column, err_msg=key)
    # Terminations (discount 0), time limits (bootstrapping from a final observation never
    # acted on) and ordinary n-step transitions are all among them.
    discount = batch["discount"]
    assert (discount == 0).any() and (discount == np.float32(0.9**3)).any()
    assert (discount > np.float32(0.9**3) + 1e-6).any()  # gamma^m, m < n: a time limit
    priorities = batch.pop(PRIORITY)
    assert priorities.dtype == np.float32
    np.testing.assert_allclose(priorities, algo.initial_priorities(batch), rtol=1e-5, atol=1e-6)


def test_c51_collector_leaves_initial_priorities_to_the_network():
    algo = build(num_atoms=5, v_min=-2.0, v_max=2.0, n_step=2)
    outs, expected = collect(algo, 20)
    for out, plain in zip(outs, expected, strict=True):
        assert (out is None) == (plain is None)
        if out is not None:
            assert PRIORITY not in out
            for key, column in plain.items():
                np.testing.assert_array_equal(out[key], column, err_msg=key)


# --- acting -------------------------------------------------------------------------------


def random_obs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, size=(n, 4)).astype(np.float32)


def test_act_greedy_with_epsilon_zero():
    algo = build(dueling=True)
    set_networks(algo, dueling=True)
    obs = random_obs(200, seed=1)
    expected = np.argmax(
        q_values_unchecked(params_of(True, ONLINE), obs.astype(np.float64)), axis=1
    )
    assert 0 < expected.sum() < len(expected)  # both actions are greedy somewhere
    actions = algo.act(obs, 0.0, np.random.default_rng(0))
    assert actions.shape == (200,)
    np.testing.assert_array_equal(actions, expected)
    np.testing.assert_array_equal(algo.act(np.array(OBS), 0.0, np.random.default_rng(5)), [0, 1, 1])


def q_values_unchecked(p, obs):
    h = np.maximum(obs @ p["torso/0/w"] + p["torso/0/b"], 0.0)
    adv = h @ p["advantage/w"] + p["advantage/b"]
    return h @ p["value/w"] + p["value/b"] + adv - adv.mean(axis=1, keepdims=True)


def test_act_uniform_with_epsilon_one():
    algo = dqn.build(Params(), OBS_SPACE, gym.spaces.Discrete(3), MODEL, seed=0)
    obs = np.repeat(np.array(OBS[:1], np.float32), 30_000, axis=0)
    greedy = algo.act(obs[:1], 0.0, np.random.default_rng(0))[0]
    actions = algo.act(obs, 1.0, np.random.default_rng(1))
    counts = np.bincount(actions, minlength=3)
    assert len(counts) == 3
    # 30000 draws: each frequency is 1/3 within ~5 standard deviations (0.0027 each).
    np.testing.assert_allclose(counts / len(actions), 1 / 3, atol=0.015)
    # epsilon 0.5: greedy with probability 0.5 + 0.5/3.
    half = algo.act(obs, 0.5, np.random.default_rng(2))
    assert np.mean(half == greedy) == pytest.approx(0.5 + 0.5 / 3, abs=0.015)


def test_act_is_reproducible_with_the_same_rng_seed():
    algo = build()
    obs = random_obs(50, seed=3)
    first = algo.act(obs, 0.5, np.random.default_rng(9))
    second = algo.act(obs, 0.5, np.random.default_rng(9))
    np.testing.assert_array_equal(first, second)
    assert first.dtype.kind == "i"


# --- build, spaces, registry --------------------------------------------------------------


@pytest.mark.parametrize(
    "action_space",
    [gym.spaces.Box(-1.0, 1.0, shape=(2,)), gym.spaces.MultiDiscrete([2, 2])],
    ids=["box", "multidiscrete"],
)
def test_build_refuses_non_discrete_actions(action_space):
    with pytest.raises(ConfigError, match="Discrete action space"):
        dqn.build(Params(), OBS_SPACE, action_space, MODEL)


@pytest.mark.parametrize(
    "obs_space, match",
    [
        (gym.spaces.Box(0, 255, shape=(84, 84, 3), dtype=np.uint8), "mlp.*needs flat"),
        (gym.spaces.Box(0.0, 1.0, shape=(4, 4)), "mlp.*needs flat"),
        (gym.spaces.Discrete(5), "Box observation space"),
    ],
    ids=["image", "matrix", "discrete"],
)
def test_build_refuses_observations_the_model_cannot_take(obs_space, match):
    with pytest.raises(ConfigError, match=match):
        dqn.build(Params(), obs_space, ACTION_SPACE, MODEL)


def test_conv_dqn_keeps_frames_uint8():
    frames = gym.spaces.Box(0, 255, shape=(42, 42, 4), dtype=np.uint8)
    conv = ModelConfig(kind="conv", conv=((8, 4, 2), (8, 3, 2)), hidden=(16,))
    spec = dqn.replay_spec(Params(), frames, ACTION_SPACE)
    assert spec["obs"] == ((42, 42, 4), np.dtype(np.uint8)) == spec["next_obs"]
    algo = dqn.build(Params(), frames, ACTION_SPACE, conv)
    assert "q/torso/conv0/w" in algo.variables
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.integers(0, 256, (5, 42, 42, 4), dtype=np.uint8),
        "action": rng.integers(0, 2, 5),
        "reward": rng.normal(size=5).astype(np.float32),
        "next_obs": rng.integers(0, 256, (5, 42, 42, 4), dtype=np.uint8),
        "discount": np.full(5, 0.9, np.float32),
    }
    grads, stats, priorities = algo.learn(batch, np.ones(5, np.float32))
    assert [g.shape for g in grads] == [tuple(v.shape) for v in algo.variables.values()]
    assert all(np.all(np.isfinite(g)) for g in grads) and priorities.shape == (5,)
    assert algo.act(batch["obs"], 0.0, rng).shape == (5,)


def test_build_gives_identical_networks_for_the_same_seed():
    first = dqn.build(Params(), OBS_SPACE, ACTION_SPACE, MODEL, seed=11)
    second = dqn.build(Params(), OBS_SPACE, ACTION_SPACE, MODEL, seed=11)
    other = dqn.build(Params(), OBS_SPACE, ACTION_SPACE, MODEL, seed=12)
    assert list(first.variables) == list(second.variables)
    for name in first.variables:
        np.testing.assert_array_equal(first.variables[name], second.variables[name])
    assert any(
        not np.array_equal(first.variables[n].numpy(), other.variables[n].numpy())
        for n in first.variables
    )
    # The target starts as a copy of the online network.
    for src, dst in zip(first.q.trainable_variables, first.target.trainable_variables, strict=True):
        np.testing.assert_array_equal(src.numpy(), dst.numpy())


def test_variable_names_and_shapes():
    algo = build(dueling=True)
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "q/advantage/b": (2,),
        "q/advantage/w": (3, 2),
        "q/torso/0/b": (3,),
        "q/torso/0/w": (4, 3),
        "q/value/b": (1,),
        "q/value/w": (3, 1),
    }
    assert list(algo.variables) == sorted(algo.variables)
    assert set(build(dueling=False).variables) == {
        "q/advantage/b",
        "q/advantage/w",
        "q/torso/0/b",
        "q/torso/0/w",
    }


def test_optimizer_spec_from_params():
    step = {"lr_schedule": "step", "lr_step_factor": 0.5, "lr_step_period": 7}
    params = Params(optimizer="rmsprop", lr=3e-4, **step)
    assert dqn.optimizer(params) == OptimizerSpec(
        kind="rmsprop", lr=3e-4, decay_rate=0.5, decay_steps=7
    )


def test_replay_spec_columns():
    spec = dqn.replay_spec(Params(), OBS_SPACE, ACTION_SPACE)
    assert spec == {
        "obs": ((4,), np.dtype(np.float32)),
        "action": ((), np.dtype(np.int64)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": ((4,), np.dtype(np.float32)),
        "discount": ((), np.dtype(np.float32)),
    }


def test_registry_unknown_algorithm_lists_dqn():
    with pytest.raises(ConfigError, match=r"unknown algorithm 'nope'.*dqn"):
        registry.module("nope")
    with pytest.raises(ConfigError, match="dqn"):
        registry.params_class("DQN")


def test_registry_finds_dqn():
    assert "dqn" in registry.known()
    assert registry.module("dqn") is dqn
    assert registry.params_class("dqn") is Params


def test_a_fused_step_gives_what_learn_and_the_learners_apply_give_as_two_calls():
    """`fuse_update` takes the learner's optimizer step into `learn`'s compiled call: the
    same values and optimizer state as `learn` then `LocalOptimizer.apply`, not applied
    twice; the target network is left to `sync_target` (False)."""
    spec = OptimizerSpec(kind="adam", lr=0.01)
    separate, fused = build(), build()
    apart, together = (
        LocalOptimizer(spec, separate.variables),
        LocalOptimizer(spec, fused.variables),
    )
    assert fused.fuse_update(together) is False
    weights = np.array(WEIGHTS, np.float32)
    for _ in range(3):
        assert apart.apply(separate.learn(make_batch(), weights).grads)
        step = fused.learn(make_batch(), weights)
        assert bool(step.grads.applied) and together.apply(step.grads)
    names = list(separate.variables)
    for name in names:
        np.testing.assert_allclose(
            fused.variables[name].numpy(), separate.variables[name].numpy(), rtol=1e-6, atol=1e-7
        )
    assert together.state(names)["step"] == apart.state(names)["step"] == 3
    target = fused.target.trainable_variables[0].numpy()
    np.testing.assert_array_equal(target, separate.target.trainable_variables[0].numpy())
