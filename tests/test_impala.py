"""Tests of easyrl.algorithms.impala and easyrl.algorithms.a3c: V-trace against the paper's
literal definition, the loss and its gradients against an independent float64 numpy
computation, unroll collection on real envs, a conv smoke test, hooks and validation."""

import gymnasium as gym
import numpy as np
import pytest
from numeric import central_differences

from easyrl.algorithms import a3c, impala
from easyrl.algorithms.impala import Params
from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.config import ModelConfig
from easyrl.envs import final_observations, make_vector_env
from easyrl.errors import ConfigError, EasyRLError

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
DISCRETE = gym.spaces.Discrete(3)
MODEL = ModelConfig(hidden=(3,), activation="tanh")  # smooth: finite differences are exact
FRAMES = gym.spaces.Box(0, 255, (42, 42, 4), np.uint8)
CONV = ModelConfig(kind="conv", conv=((8, 4, 2), (8, 3, 2)), hidden=(16,), padding="valid")

# Known parameter values of the tiny network (torso tanh(obs @ w + b), two linear heads).
NETWORK = {
    "net/torso/0/w": [[0.5, -0.3, 0.2], [0.1, 0.4, -0.6], [-0.2, 0.3, 0.5]],
    "net/torso/0/b": [0.1, -0.05, 0.2],
    "net/logits/w": [[0.7, -0.4, 0.1], [0.2, 0.5, -0.3], [-0.3, 0.6, 0.4]],
    "net/logits/b": [0.05, -0.1, 0.0],
    "net/value/w": [[0.7], [-0.4], [0.5]],
    "net/value/b": [0.2],
}


def f32(x) -> np.ndarray:
    """What the module sees: the float32 value, as float64 for the reference."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def set_network(algo, values: dict) -> None:
    assert set(algo.variables) == set(values)
    for name, var in algo.variables.items():
        var.assign(np.asarray(values[name], np.float32))


# --- independent numpy references (float64) -----------------------------------------------


def vtrace_reference(behaviour_logp, target_logp, rewards, discounts, values, bootstrap, *clips):
    """V-trace written literally from the paper's definition, with per-step discounts:

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} discount_i) (prod_{i=s}^{t-1} c_i)
                    * delta_t V
    delta_t V = min(rho_bar, rho_t) (r_t + discount_t V(x_{t+1}) - V(x_t)), V(x_T) = bootstrap
    c_i = lam * min(c_bar, rho_i)
    pg_advantage_s = min(rho_bar, rho_s) (r_s + discount_s v_{s+1} - V(x_s)), v_T = bootstrap
    """
    rho_bar, c_bar, lam = clips
    num_steps = len(rewards)
    rho = np.exp(target_logp - behaviour_logp)  # [T, B]
    clipped = np.minimum(rho_bar, rho)
    c = lam * np.minimum(c_bar, rho)
    next_values = np.concatenate([values[1:], bootstrap[None]])
    delta = clipped * (rewards + discounts * next_values - values)  # [T, B]
    vs = np.zeros((num_steps + 1, rewards.shape[1]))
    vs[num_steps] = bootstrap
    for s in range(num_steps):
        total = values[s].copy()
        for t in range(s, num_steps):
            # Empty products (t == s) are 1.
            total += np.prod(discounts[s:t], axis=0) * np.prod(c[s:t], axis=0) * delta[t]
        vs[s] = total
    pg_advantages = clipped * (rewards + discounts * vs[1:] - values)
    return vs[:num_steps], pg_advantages


def forward(p: dict, obs: np.ndarray):
    """Logits `[..., A]` and values `[...]` of the tiny network on obs `[..., 3]`."""
    h = np.tanh(obs @ p["net/torso/0/w"] + p["net/torso/0/b"])
    return h @ p["net/logits/w"] + p["net/logits/b"], (h @ p["net/value/w"] + p["net/value/b"])[
        ..., 0
    ]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))


def pieces(p: dict, batch: dict):
    """Time-major (log pi `[T, B, A]`, target log-probs `[T, B]`, values `[T, B]`, bootstrap
    `[B]`, behaviour log-probs `[T, B]`) of the reference network on `batch`."""
    num_steps = batch["action"].shape[1]
    logits, values = forward(p, f32(batch["obs"]))  # [B, T+1, A], [B, T+1]
    log_pi = np.swapaxes(log_softmax(logits[:, :num_steps]), 0, 1)
    action = batch["action"].T  # [T, B]
    target_logp = np.take_along_axis(log_pi, action[..., None], axis=2)[..., 0]
    behaviour = np.swapaxes(log_softmax(f32(batch["logits"])), 0, 1)
    behaviour_logp = np.take_along_axis(behaviour, action[..., None], axis=2)[..., 0]
    return log_pi, target_logp, values[:, :num_steps].T, values[:, num_steps], behaviour_logp


def reference_targets(p: dict, batch: dict, settings) -> tuple[np.ndarray, np.ndarray]:
    _, target_logp, values, bootstrap, behaviour_logp = pieces(p, batch)
    return vtrace_reference(
        behaviour_logp,
        target_logp,
        f32(batch["reward"]).T,
        f32(batch["discount"]).T,
        values,
        bootstrap,
        settings.rho_bar,
        settings.c_bar,
        settings.lam,
    )


def reference_loss(p: dict, batch: dict, targets, settings) -> dict:
    """The IMPALA loss in float64 with the V-trace targets held fixed (they are constants)."""
    vs, pg_advantages = targets
    log_pi, target_logp, values, _, behaviour_logp = pieces(p, batch)
    policy_loss = -np.mean(target_logp * pg_advantages)
    baseline_loss = 0.5 * np.mean((vs - values) ** 2)
    entropy = np.mean(-np.sum(np.exp(log_pi) * log_pi, axis=2))
    return {
        "loss": policy_loss
        + settings.baseline_cost * baseline_loss
        - settings.entropy_cost * entropy,
        "policy_loss": policy_loss,
        "baseline_loss": baseline_loss,
        "entropy": entropy,
        "rho_mean": np.mean(np.exp(target_logp - behaviour_logp)),
        "value_mean": np.mean(values),
    }


def finite_difference_grads(p: dict, batch: dict, settings) -> dict:
    targets = reference_targets(p, batch, settings)
    return central_differences(p, lambda q: reference_loss(q, batch, targets, settings)["loss"])


# --- V-trace ------------------------------------------------------------------------------


def random_unrolls(rng, num_steps=7, batch=5):
    """Float32 inputs of moderate scale: |r|, |V| ~ 1, rho in ~[0.3, 3], some discounts 0."""
    behaviour_logp = rng.uniform(-2.0, -0.2, (num_steps, batch))
    target_logp = behaviour_logp + rng.normal(0.0, 0.6, (num_steps, batch))
    rewards = rng.normal(0.0, 1.0, (num_steps, batch))
    discounts = np.where(rng.random((num_steps, batch)) < 0.2, 0.0, 0.95)
    values = rng.normal(0.0, 1.0, (num_steps, batch))
    bootstrap = rng.normal(0.0, 1.0, batch)
    inputs = (behaviour_logp, target_logp, rewards, discounts, values, bootstrap)
    return tuple(x.astype(np.float32) for x in inputs)


@pytest.mark.parametrize(
    "clips",
    [(1.0, 1.0, 1.0), (1.0, 1.0, 0.6), (2.0, 0.7, 0.9), (0.8, 0.5, 1.0), (100.0, 100.0, 1.0)],
    ids=["paper", "lam0.6", "rho2-c0.7-lam0.9", "rho0.8-c0.5", "unclipped"],
)
def test_vtrace_matches_the_literal_definition(clips):
    from easyrl.algorithms.impala.agent import vtrace

    rng = np.random.default_rng(sum(int(10 * c) for c in clips))
    inputs = random_unrolls(rng)
    rho = np.exp(f32(inputs[1]) - f32(inputs[0]))
    assert (f32(inputs[3]) == 0).any() and (f32(inputs[3]) == 0).sum(axis=0).max() < 7
    if clips[0] < 10:
        assert (rho > clips[0]).any() and (rho < clips[0]).any()  # clipping active
    vs, pg = (x.numpy() for x in vtrace(*inputs, *clips))
    expected_vs, expected_pg = vtrace_reference(*(f32(x) for x in inputs), *clips)
    assert vs.shape == pg.shape == (7, 5) and vs.dtype == np.float32
    np.testing.assert_allclose(vs, expected_vs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(pg, expected_pg, rtol=0, atol=1e-5)
    # The comparison is meaningful: the traces change the targets well beyond the tolerance.
    assert np.abs(expected_vs - f32(inputs[4])).mean() > 0.1


def test_vtrace_on_policy_is_the_n_step_return():
    from easyrl.algorithms.impala.agent import vtrace

    # gamma 0.9, T = 3, two envs; env 0's episode ends at t = 1 (discount 0 there).
    rewards = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]], np.float32)  # [T, B]
    discounts = np.array([[0.9, 0.9], [0.0, 0.9], [0.9, 0.9]], np.float32)
    values = np.array([[0.5, 1.0], [1.0, 0.0], [2.0, -1.0]], np.float32)
    bootstrap = np.array([4.0, 2.0], np.float32)
    logp = np.log(np.full((3, 2), 0.3, np.float32))
    vs, pg = (x.numpy() for x in vtrace(logp, logp, rewards, discounts, values, bootstrap, 1, 1, 1))
    # Env 0: G2 = 3 + 0.9 * 4 = 6.6; G1 = 2 + 0 (episode end) = 2; G0 = 1 + 0.9 * 2 = 2.8.
    # Env 1: G2 = 1 + 0.9 * 2 = 2.8; G1 = 1 + 0.9 * 2.8 = 3.52; G0 = 1 + 0.9 * 3.52 = 4.168.
    returns = np.array([[2.8, 4.168], [2.0, 3.52], [6.6, 2.8]])
    np.testing.assert_allclose(vs, returns, rtol=1e-6)
    np.testing.assert_allclose(pg, returns - values, rtol=1e-6, atol=1e-6)


# --- hooks, validation, build -------------------------------------------------------------


def test_replay_spec_and_flow():
    assert impala.SPEC.flow == "async_replay" and impala.SPEC.replay_kinds == ("trajectory",)
    assert a3c.SPEC.flow == "actor_gradients" and a3c.SPEC.replay_kinds == ()
    f4 = np.dtype(np.float32)
    expected = {
        "obs": ((6, 3), f4),
        "action": ((5,), np.dtype(np.int64)),
        "logits": ((5, 3), f4),
        "reward": ((5,), f4),
        "discount": ((5,), f4),
    }
    assert impala.replay_spec(Params(unroll_length=5), OBS_SPACE, DISCRETE) == expected
    assert a3c.replay_spec(a3c.Params(unroll_length=5), OBS_SPACE, DISCRETE) == expected
    frames = impala.replay_spec(Params(unroll_length=4), FRAMES, gym.spaces.Discrete(6))
    assert frames["obs"] == ((5, 42, 42, 4), np.dtype(np.uint8))
    assert frames["logits"] == ((4, 6), f4)


def test_optimizer_spec_with_and_without_decay():
    assert impala.optimizer(Params()) == OptimizerSpec(kind="adam", lr=6e-4)
    linear = {"lr_schedule": "linear", "lr_linear_steps": 100_000}
    decayed = impala.optimizer(Params(optimizer="rmsprop", **linear))
    assert decayed == OptimizerSpec(
        kind="rmsprop", lr=6e-4, schedule="polynomial", decay_steps=100_000, end_lr=0.0, power=1.0
    )
    a3c_linear = a3c.Params(lr_schedule="linear", lr_linear_steps=10, lr_end=1e-4)
    assert a3c.optimizer(a3c_linear) == OptimizerSpec(
        kind="adam", lr=1e-3, schedule="polynomial", decay_steps=10, end_lr=1e-4
    )
    assert a3c.optimizer(a3c.Params(optimizer="sgd")) == OptimizerSpec(kind="sgd", lr=1e-3)
    # The schedule is linear: half way, half the learning rate.
    import tensorflow as tf

    from easyrl.algorithms.optimizers import Optimizer

    opt = Optimizer(decayed, [tf.Variable(np.zeros(2, np.float32))])
    for step, lr in [(0, 6e-4), (50_000, 3e-4), (100_000, 0.0), (200_000, 0.0)]:
        opt.step.assign(step)
        assert float(opt.learning_rate()) == pytest.approx(lr, abs=1e-9)


@pytest.mark.parametrize(
    "change",
    [
        {"unroll_length": 0},
        {"batch_size": 0},
        {"gamma": 1.5},
        {"rho_bar": 0.0},
        {"c_bar": -1.0},
        {"lam": 1.1},
        {"baseline_cost": -0.5},
        {"entropy_cost": float("nan")},
        {"optimizer": "adagrad"},
        {"lr": 0.0},
        {"lr_schedule": "cosine"},
        {"lr_linear_steps": 0, "lr_schedule": "linear"},
        {"lr_end": 1.0},
        {"grad_clip": -1.0},
        {"max_staleness": -1},
    ],
)
def test_params_are_checked(change):
    name = next(iter(change))
    with pytest.raises(ConfigError, match=f"impala: {name} must be"):
        Params(**change)
    if name in {f.name for f in a3c.Params.__dataclass_fields__.values()}:
        with pytest.raises(ConfigError, match=f"a3c: {name} must be"):
            a3c.Params(**change)


@pytest.mark.parametrize(
    ("obs_space", "action_space", "model", "match"),
    [
        (OBS_SPACE, gym.spaces.Box(-1, 1, (2,)), MODEL, "Discrete action space"),
        (FRAMES, DISCRETE, MODEL, "rank 1"),
        (OBS_SPACE, DISCRETE, CONV, "rank 3"),
        (gym.spaces.Discrete(4), DISCRETE, MODEL, "Box observation"),
    ],
    ids=["box-actions", "mlp-on-frames", "conv-on-flat", "discrete-obs"],
)
def test_build_refuses_unsupported_setups(obs_space, action_space, model, match):
    with pytest.raises(ConfigError, match=f"impala.*{match}"):
        impala.build(Params(), obs_space, action_space, model)
    with pytest.raises(ConfigError, match=f"a3c.*{match}"):
        a3c.build(a3c.Params(), obs_space, action_space, model)


def test_variables_flow_and_seeded_init():
    algo = impala.build(Params(), OBS_SPACE, DISCRETE, ModelConfig(hidden=(5, 4)), seed=3)
    assert {k: tuple(v.shape) for k, v in algo.variables.items()} == {
        "net/logits/b": (3,),
        "net/logits/w": (4, 3),
        "net/torso/0/b": (5,),
        "net/torso/0/w": (3, 5),
        "net/torso/1/b": (4,),
        "net/torso/1/w": (5, 4),
        "net/value/b": (1,),
        "net/value/w": (4, 1),
    }
    assert list(algo.variables) == sorted(algo.variables)
    assert algo.flow == "async_replay" and algo.target_update_period == 0
    # Small policy head (0.01 * Glorot limit), value head at full scale.
    assert np.abs(algo.variables["net/logits/w"].numpy()).max() <= 0.01
    assert np.abs(algo.variables["net/value/w"].numpy()).max() > 0.05
    same = impala.build(Params(), OBS_SPACE, DISCRETE, ModelConfig(hidden=(5, 4)), seed=3)
    other = impala.build(Params(), OBS_SPACE, DISCRETE, ModelConfig(hidden=(5, 4)), seed=4)
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), same.variables[name].numpy())
    assert not np.array_equal(algo.variables["net/torso/0/w"], other.variables["net/torso/0/w"])


# --- the loss -----------------------------------------------------------------------------


def make_batch(p: dict, num_steps=3, batch=2, seed=5) -> dict:
    """Random obs; behaviour logits around the reference network's (rho spread around 1);
    an episode end inside the unroll of env 0."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1.5, 1.5, (batch, num_steps + 1, 3)).astype(np.float32)
    logits, _ = forward(p, f32(obs[:, :num_steps]))
    discount = np.full((batch, num_steps), 0.9, np.float32)
    discount[0, 1] = 0.0
    return {
        "obs": obs,
        "action": rng.integers(0, 3, (batch, num_steps)).astype(np.int64),
        "logits": (logits + rng.normal(0.0, 0.8, logits.shape)).astype(np.float32),
        "reward": rng.normal(0.0, 1.0, (batch, num_steps)).astype(np.float32),
        "discount": discount,
    }


@pytest.mark.parametrize(
    "changes",
    [
        {"grad_clip": 0.0},
        {"grad_clip": 0.0, "rho_bar": 0.9, "c_bar": 0.8, "lam": 0.9, "entropy_cost": 0.1},
    ],
    ids=["paper", "clipped-lam"],
)
def test_loss_and_gradients_match_reference(changes):
    params = Params(unroll_length=3, gamma=0.9, **changes)
    algo = impala.build(params, OBS_SPACE, DISCRETE, MODEL, seed=0)
    p = {k: f32(v) for k, v in NETWORK.items()}
    set_network(algo, p)
    batch = make_batch(p)
    settings = impala.agent_params(params)
    _, target_logp, _, _, behaviour_logp = pieces(p, batch)
    rho = np.exp(target_logp - behaviour_logp)
    assert (rho > 1.0).any() and (rho < 0.8).any()
    ref = reference_loss(p, batch, reference_targets(p, batch, settings), settings)
    grads, stats, priorities = algo.learn(batch, np.ones(2))
    assert priorities is None
    assert set(stats) == {"policy_loss", "baseline_loss", "entropy", "rho_mean", "value_mean"}
    for key, value in stats.items():
        assert value == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    expected = finite_difference_grads(p, batch, settings)
    assert len(grads) == len(algo.variables)
    for grad, name in zip(grads, algo.variables, strict=True):
        assert grad.shape == expected[name].shape, name
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
        assert np.abs(expected[name]).max() > 1e-4, name  # every variable gets a gradient
    # Learning does not change the variables (the PS applies the gradients).
    for name, var in algo.variables.items():
        np.testing.assert_array_equal(var.numpy(), p[name].astype(np.float32))


def test_gradient_clipping_to_global_norm():
    params = Params(unroll_length=3, gamma=0.9, grad_clip=0.01)
    algo = impala.build(params, OBS_SPACE, DISCRETE, MODEL, seed=0)
    p = {k: f32(v) for k, v in NETWORK.items()}
    set_network(algo, p)
    batch = make_batch(p)
    grads, _, _ = algo.learn(batch, None)
    expected = finite_difference_grads(p, batch, impala.agent_params(params))
    raw_norm = np.sqrt(sum(np.sum(g**2) for g in expected.values()))
    assert raw_norm > 10 * 0.01
    assert np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)) == pytest.approx(0.01)
    for grad, name in zip(grads, algo.variables, strict=True):
        np.testing.assert_allclose(grad, expected[name] * 0.01 / raw_norm, rtol=1e-4, atol=1e-9)


def test_learn_checks_the_batch():
    algo = impala.build(Params(unroll_length=3), OBS_SPACE, DISCRETE, MODEL, seed=0)
    batch = make_batch({k: f32(v) for k, v in NETWORK.items()})
    with pytest.raises(EasyRLError, match="lacks columns"):
        algo.learn({k: v for k, v in batch.items() if k != "logits"}, None)
    with pytest.raises(EasyRLError, match="'reward' must be"):
        algo.learn({**batch, "reward": batch["reward"][:, :2]}, None)


def test_a3c_is_impala_on_policy_with_n_step_advantages():
    params = a3c.Params(unroll_length=3, gamma=0.9, grad_clip=0.0)
    algo = a3c.build(params, OBS_SPACE, DISCRETE, MODEL, seed=0)
    assert algo.flow == "actor_gradients" and algo.target_update_period == 0
    assert (algo.params.rho_bar, algo.params.c_bar, algo.params.lam) == (1.0, 1.0, 1.0)
    assert (algo.params.baseline_cost, algo.params.entropy_cost) == (0.5, 0.01)
    p = {k: f32(v) for k, v in NETWORK.items()}
    set_network(algo, p)
    batch = make_batch(p)
    # On-policy: the behaviour logits are the network's own at these weights.
    logits, _ = algo.evaluate(batch["obs"][:, :3].reshape(-1, 3))
    batch["logits"] = logits.reshape(2, 3, 3)
    _, target_logp, values, bootstrap, _ = pieces(p, batch)
    reward, discount = f32(batch["reward"]).T, f32(batch["discount"]).T
    returns = np.zeros((4, 2))  # n-step bootstrapped returns, backwards from V(x_T)
    returns[3] = bootstrap
    for t in reversed(range(3)):
        returns[t] = reward[t] + discount[t] * returns[t + 1]
    advantages = returns[:3] - values
    _, stats, _ = algo.learn(batch, None)
    assert stats["rho_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["policy_loss"] == pytest.approx(-np.mean(target_logp * advantages), rel=1e-4)
    assert stats["baseline_loss"] == pytest.approx(0.5 * np.mean(advantages**2), rel=1e-4)


# --- acting and collection ----------------------------------------------------------------


def test_act_samples_the_softmax():
    algo = impala.build(Params(unroll_length=1), OBS_SPACE, DISCRETE, MODEL, seed=0)
    p = {k: f32(v) for k, v in NETWORK.items()}
    set_network(algo, p)
    obs = np.repeat(np.array([[1.0, -0.5, 0.8]], np.float32), 20_000, axis=0)
    collector = algo.collector(len(obs), seed=0)
    action = collector.act(obs, np.random.default_rng(3))
    logits, _ = forward(p, f32(obs[:1]))
    probs = np.exp(log_softmax(logits[0]))
    # 20000 draws: each frequency within ~5 standard deviations (<= 0.0036).
    np.testing.assert_allclose(np.bincount(action, minlength=3) / 20_000, probs, atol=0.018)
    assert algo.greedy(obs[:1])[0] == np.argmax(logits[0])


def test_collector_checks_the_protocol():
    algo = impala.build(Params(unroll_length=2), OBS_SPACE, DISCRETE, MODEL, seed=0)
    collector = algo.collector(2, seed=0)
    assert collector.resets_envs is False
    obs, no = np.zeros((2, 3), np.float32), np.zeros(2, bool)
    with pytest.raises(EasyRLError, match="without a preceding act"):
        collector.observe(np.zeros(2), obs, obs, no, no)
    collector.act(obs)
    with pytest.raises(EasyRLError, match="twice"):
        collector.act(obs)
    with pytest.raises(EasyRLError, match="rows"):
        collector.observe(np.zeros(3), obs, obs, no, no)
    assert collector.observe(np.zeros(2), obs, obs, no, no) is None
    with pytest.raises(EasyRLError, match=r"obs must be \[2, 3\]"):
        collector.act(np.zeros((3, 3)))


def test_cartpole_unrolls():
    num_envs, num_steps, gamma = 3, 10, 0.9
    env = make_vector_env("CartPole-v1", num_envs, vector="sync", seed=0, max_episode_steps=15)
    spaces = (env.single_observation_space, env.single_action_space)
    params = Params(unroll_length=num_steps, gamma=gamma)
    algo = impala.build(params, *spaces, ModelConfig(hidden=(8,)), seed=0)
    collector = algo.collector(num_envs, seed=0, actor_index=1, num_actors=2)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    unrolls, records = [], []
    try:
        for _ in range(3 * num_steps):
            action = collector.act(obs, rng)
            assert action.dtype == np.int64 and action.shape == (num_envs,)
            next_obs, reward, terminated, truncated, infos = env.step(action)
            real = final_observations(next_obs, infos, terminated | truncated)
            records.append((obs, action, reward, terminated | truncated))
            out = collector.observe(reward, next_obs, real, terminated, truncated)
            assert (out is not None) == (len(records) % num_steps == 0)
            if out is not None:
                unrolls.append(out)
            obs = next_obs
    finally:
        env.close()
    assert len(unrolls) == 3 and collector.stats() == {"unrolls": 3.0}
    spec = impala.replay_spec(params, *spaces)
    for unroll in unrolls:
        assert set(unroll) == set(spec)
        for name, (shape, dtype) in spec.items():
            assert unroll[name].shape == (num_envs, *shape), name
            assert unroll[name].dtype == dtype, name
        # The stored behaviour logits are the network's on the stored observations.
        logits, _ = algo.evaluate(unroll["obs"][:, :num_steps].reshape(-1, 4))
        np.testing.assert_allclose(
            unroll["logits"], logits.reshape(num_envs, num_steps, 2), rtol=1e-6, atol=1e-6
        )
    for first, second in zip(unrolls, unrolls[1:]):
        np.testing.assert_array_equal(first["obs"][:, num_steps], second["obs"][:, 0])
    # Batch-major columns against the step-by-step records.
    obs_rec, action_rec, reward_rec, done_rec = (np.stack(x, axis=1) for x in zip(*records))
    assert done_rec.any() and not done_rec.all()
    for k, unroll in enumerate(unrolls):
        steps = slice(k * num_steps, (k + 1) * num_steps)
        np.testing.assert_array_equal(unroll["obs"][:, :num_steps], obs_rec[:, steps])
        np.testing.assert_array_equal(unroll["action"], action_rec[:, steps])
        np.testing.assert_array_equal(unroll["reward"], reward_rec[:, steps])
        np.testing.assert_array_equal(unroll["discount"] == 0, done_rec[:, steps])
        np.testing.assert_array_equal(
            unroll["discount"], np.where(done_rec[:, steps], 0.0, np.float32(gamma))
        )
    grads, stats, _ = algo.learn({k: np.concatenate([u[k] for u in unrolls]) for k in spec}, None)
    assert all(np.isfinite(g).all() for g in grads)
    assert stats["rho_mean"] == pytest.approx(1.0, abs=1e-5)  # unchanged weights: on-policy


def test_conv_smoke_on_uint8_frames():
    params = Params(unroll_length=3)
    algo = impala.build(params, FRAMES, gym.spaces.Discrete(6), CONV, seed=0)
    spec = impala.replay_spec(params, FRAMES, gym.spaces.Discrete(6))
    assert spec["obs"] == ((4, 42, 42, 4), np.dtype(np.uint8))
    rng = np.random.default_rng(0)
    collector = algo.collector(2, seed=0)
    unroll = None
    for _ in range(3):
        frames = rng.integers(0, 256, (2, 42, 42, 4), dtype=np.uint8)
        collector.act(frames, rng)
        no = np.zeros(2, bool)
        unroll = collector.observe(np.ones(2), frames, frames, no, no)
    assert unroll["obs"].dtype == np.uint8 and unroll["obs"].shape == (2, 4, 42, 42, 4)
    batch = {
        "obs": rng.integers(0, 256, (2, 4, 42, 42, 4), dtype=np.uint8),
        "action": rng.integers(0, 6, (2, 3)).astype(np.int64),
        "logits": rng.normal(size=(2, 3, 6)).astype(np.float32),
        "reward": rng.normal(size=(2, 3)).astype(np.float32),
        "discount": np.full((2, 3), 0.99, np.float32),
    }
    grads, stats, _ = algo.learn(batch, None)
    assert [g.shape for g in grads] == [tuple(v.shape) for v in algo.variables.values()]
    assert all(np.isfinite(g).all() for g in grads)
    assert all(np.isfinite(v) for v in stats.values())
    assert np.abs(grads[list(algo.variables).index("net/torso/conv0/w")]).max() > 0
