"""Custom torsos (`model.kind: package.module:Class`, see `easyrl.models.build_torso`) in every
algorithm: a plain tf.Module torso and a Keras 3 model (`tests/custom_torsos.py`) built into
each agent on a real env's spaces, one learning step on a batch collected on that env, and the
torso's variables among the agent's, with non-zero gradients. Then the Keras adapter: its
names, assignments the Keras model sees, ES's per-env forwards through a scratch copy, and the
errors of torsos that break the contract."""

import dataclasses

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf
from custom_torsos import Gated, Residual
from rollouts import collect, joined
from test_es import run_round
from test_ppo import run_rounds

from easyrl.algorithms import (
    a2c,
    a3c,
    bc,
    bcq,
    ddpg,
    dqn,
    es,
    impala,
    marwil,
    pg,
    ppo,
    r2d2,
    sac,
    td3,
)
from easyrl.config import ModelConfig
from easyrl.envs import make_vector_env
from easyrl.errors import ConfigError
from easyrl.models import KerasTorso, build_torso, named_variables
from easyrl.models.flat import FlatVariables

TORSOS = {"module": "custom_torsos:Residual", "keras": "custom_torsos:Gated"}
"""The example torsos by form: a plain tf.Module and a Keras model subclass."""
CARTPOLE = (gym.spaces.Box(-5.0, 5.0, (4,), np.float32), gym.spaces.Discrete(2))
PENDULUM = (gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,)))
SPACES = {"CartPole-v1": CARTPOLE, "Pendulum-v1": PENDULUM}


def model_of(form: str) -> ModelConfig:
    return ModelConfig(kind=TORSOS[form], hidden=(8,), activation="tanh")


def learn_rounds(module, params, form):
    """PPO's agent (PPO, A2C, PG): one round of 4 CartPole envs x 8 steps, the first step."""
    algo = module.build(params, *CARTPOLE, model_of(form), seed=0)
    (batch,) = run_rounds(algo, "CartPole-v1", 4, 1)[0]
    return algo, next(iter(algo.learn_round(batch, np.random.default_rng(0)))).grads


def learn_es(form):
    # Keras draws its own initial weights: seeded here, so that the two perturbed policies'
    # episodes (up to 100 steps) differ in length every time and the ES gradient is not 0.
    keras.utils.set_random_seed(0)
    algo = es.build(es.Params(episodes_per_perturbation=1), *CARTPOLE, model_of(form), seed=0)
    env = make_vector_env("CartPole-v1", 2, vector="sync", seed=0, max_episode_steps=100)
    try:
        batch = run_round(env, algo.collector(2, seed=1), share=2)
    finally:
        env.close()
    return algo, next(iter(algo.learn_round(batch, np.random.default_rng(0)))).grads


def learn_transitions(module, params, form, env_id="Pendulum-v1"):
    """TD3 / DDPG / SAC / DQN: the transitions their collector made on 4 steps of 3 envs."""
    algo = module.build(params, *SPACES[env_id], model_of(form), seed=0)
    batch = joined(collect(algo, env_id, 3, 4))
    return algo, algo.learn(batch, np.ones(len(batch["reward"]), np.float32)).grads


def learn_offline(module, params, form):
    """MARWIL / BC: one whole CartPole episode of random actions as a dataset's items."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    rows = {"obs": [], "action": [], "reward": []}
    done, rng = False, np.random.default_rng(0)
    while not done:
        action = int(rng.integers(2))
        rows["obs"].append(obs)
        rows["action"].append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        rows["reward"].append(reward)
        done = terminated or truncated
    env.close()
    steps = {k: np.asarray(v) for k, v in rows.items()}
    steps.update(
        episode=np.zeros(len(steps["reward"]), np.int64), t=np.arange(len(steps["reward"]))
    )
    algo = module.build(params, *CARTPOLE, model_of(form), seed=0)
    return algo, algo.learn(module.dataset_items(params, steps)).grads


def learn_impala(form):
    algo = impala.build(impala.Params(unroll_length=5), *CARTPOLE, model_of(form), seed=0)
    (unroll,) = collect(algo, "CartPole-v1", 2, 5)
    return algo, algo.learn(unroll, None).grads


def learn_a3c(form):
    algo = a3c.build(a3c.Params(unroll_length=5), *CARTPOLE, model_of(form), seed=0)
    (unroll,) = collect(algo, "CartPole-v1", 2, 5)
    return algo, algo.learn(unroll, None).grads


def learn_bcq(form):
    """BCQ: DQN's transitions of 4 steps of 3 CartPole envs, as a dataset would give them."""
    params = bcq.Params(n_step=2)
    algo = bcq.build(params, *CARTPOLE, model_of(form), seed=0)
    collector = dqn.build(params, *CARTPOLE, model_of("module"), seed=0)
    batch = joined(collect(collector, "CartPole-v1", 3, 4))
    return algo, algo.learn(batch, np.ones(len(batch["reward"]), np.float32)).grads


def learn_r2d2(form):
    params = r2d2.Params(burn_in=2, learn_length=3, period=5)
    model = dataclasses.replace(model_of(form), lstm=4)
    algo = r2d2.build(params, *CARTPOLE, model, seed=0)
    batch = joined(collect(algo, "CartPole-v1", 2, 5))
    return algo, algo.learn(batch, np.ones(2, np.float32)).grads


CASES = {
    "ppo": (
        lambda form: learn_rounds(ppo, ppo.Params(rollout_length=8, num_epochs=1), form),
        lambda algo: [(algo.pi.torso, "pi/torso", 4), (algo.vf.torso, "vf/torso", 4)],
    ),
    "a2c": (
        lambda form: learn_rounds(a2c, a2c.Params(rollout_length=8), form),
        lambda algo: [(algo.pi.torso, "pi/torso", 4), (algo.vf.torso, "vf/torso", 4)],
    ),
    "pg": (
        lambda form: learn_rounds(pg, pg.Params(rollout_length=8), form),
        lambda algo: [(algo.pi.torso, "pi/torso", 4), (algo.vf.torso, "vf/torso", 4)],
    ),
    "es": (learn_es, lambda algo: [(algo.policy.torso, "policy", 4)]),
    "td3": (
        lambda form: learn_transitions(td3, td3.Params(policy_delay=1), form),
        lambda algo: [
            (algo.actor.torso, "actor/torso", 3),
            (algo.critic.q1.torso, "critic/q1/torso", 3 + 1),  # concat(obs, action)
            (algo.critic.q2.torso, "critic/q2/torso", 3 + 1),
        ],
    ),
    "ddpg": (
        lambda form: learn_transitions(ddpg, ddpg.Params(), form),
        lambda algo: [
            (algo.actor.torso, "actor/torso", 3),
            (algo.critic.q1.torso, "critic/q1/torso", 4),
        ],
    ),
    "sac": (
        lambda form: learn_transitions(sac, sac.Params(), form),
        lambda algo: [
            (algo.actor.torso, "actor/torso", 3),
            (algo.critic.q1.torso, "critic/q1/torso", 4),
            (algo.critic.q2.torso, "critic/q2/torso", 4),
        ],
    ),
    "marwil": (
        lambda form: learn_offline(marwil, marwil.Params(beta=1.0), form),
        lambda algo: [(algo.pi.torso, "pi/torso", 4), (algo.vf.torso, "vf/torso", 4)],
    ),
    "bc": (
        lambda form: learn_offline(bc, bc.Params(), form),
        lambda algo: [(algo.pi.torso, "pi/torso", 4)],
    ),
    "dqn": (
        lambda form: learn_transitions(dqn, dqn.Params(n_step=2), form, "CartPole-v1"),
        lambda algo: [(algo.q.torso, "q/torso", 4)],
    ),
    "impala": (learn_impala, lambda algo: [(algo.net.torso, "net/torso", 4)]),
    "r2d2": (learn_r2d2, lambda algo: [(algo.q.torso, "q/torso", 4)]),
    "a3c": (learn_a3c, lambda algo: [(algo.net.torso, "net/torso", 4)]),
    "bcq": (learn_bcq, lambda algo: [(algo.q.torso, "q/torso", 4), (algo.bc.torso, "bc/torso", 4)]),
}
"""{algorithm: (build it with a torso form and take one learning step -> (agent, gradients in
the order of its variables), its custom torsos as (module, name prefix, input width))}."""
KERAS_ONLY = ("dqn", "impala", "r2d2", "a3c", "bcq")
"""Algorithms tested with the Keras torso only (their module torsos: test_dqn, test_impala)."""


@pytest.mark.parametrize(
    "name, form",
    [(name, form) for name in CASES if name not in KERAS_ONLY for form in TORSOS]
    + [(name, "keras") for name in KERAS_ONLY],
)
def test_every_algorithm_learns_through_a_custom_torso(name, form):
    learn, torsos_of = CASES[name]
    algo, grads = learn(form)
    grads = dict(zip(algo.variables, grads, strict=True))
    for torso, prefix, width in torsos_of(algo):
        if form == "keras":
            assert isinstance(torso, KerasTorso) and isinstance(torso.layer, Gated)
            assert torso.layer.obs_shape == (width,)
        else:
            assert isinstance(torso, Residual) and torso.obs_shape == (width,)
        own = named_variables(torso)
        assert len(own) == (4 if form == "module" else 6)  # 2 dense (+ the layer norm)
        for var_name, var in own.items():
            assert var_name.startswith(f"{prefix}/")
            assert algo.variables.get(var_name) is var, var_name
            assert grads[var_name] is not None and np.abs(grads[var_name]).max() > 0, var_name


# --- the Keras adapter -------------------------------------------------------------------


def test_keras_variables_are_named_by_layer_the_same_in_every_build():
    model = model_of("keras")
    first = build_torso(model, (3,), "pi/torso", np.random.default_rng(0))
    second = build_torso(model, (3,), "target/torso", np.random.default_rng(0))
    # Keras names the second model's layers dense_2, ...: the explicit names do not follow.
    assert list(named_variables(first)) == [
        "pi/torso/0/bias",
        "pi/torso/0/kernel",
        "pi/torso/1/beta",
        "pi/torso/1/gamma",
        "pi/torso/2/bias",
        "pi/torso/2/kernel",
    ]
    assert [n.replace("target/", "pi/") for n in named_variables(second)] == list(
        named_variables(first)
    )
    assert first.out_dim == 8


def test_assigning_the_named_variables_changes_the_keras_model():
    torso = build_torso(
        ModelConfig(kind="custom_torsos:keras_mlp", hidden=(5, 2)),
        (3,),
        "q/torso",
        np.random.default_rng(0),
    )
    variables = named_variables(torso)
    assert list(variables) == [f"q/torso/{i}/{v}" for i in (0, 1) for v in ("bias", "kernel")]
    flat = FlatVariables(list(variables.values()))
    flat.assign(np.full(int(flat.offsets[-1]), 0.5, np.float32))  # inside a tf.function
    obs = np.array([[1.0, -2.0, 3.0]], np.float32)
    h = np.maximum(obs @ np.full((3, 5), 0.5) + 0.5, 0.0)
    expected = np.maximum(h @ np.full((5, 2), 0.5) + 0.5, 0.0)
    np.testing.assert_allclose(torso(obs).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(torso.layer(obs).numpy(), expected, rtol=1e-6)


def test_es_forwards_each_env_with_its_own_parameters_through_a_custom_torso():
    algo = es.build(es.Params(), *CARTPOLE, model_of("keras"), seed=0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 4)).astype(np.float32)
    theta = rng.normal(0, 0.5, (3, algo.num_params)).astype(np.float32)
    out = algo.forward(obs, theta)
    for i in range(3):
        algo.flat.assign(theta[i])
        np.testing.assert_allclose(out[i], algo.policy(obs[i : i + 1])[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out[0], out[1])


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "custom_torsos:keras_sequence_output",
            r"to features \[B, out_dim\], got shape \(2, 3, 1\)",
        ),
        ("custom_torsos:IntegerOutput", "output is int32, not float"),
        ("custom_torsos:Stray", r"explicit unique name under 'pi/torso/', got \['stray/b'"),
    ],
)
def test_torsos_breaking_the_contract_fail_at_build(kind, message):
    model = ModelConfig(kind=kind, hidden=(8,))
    with pytest.raises(ValueError, match=f"{kind}: .*{message}"):
        build_torso(model, (3,), "pi/torso", np.random.default_rng(0))
    with pytest.raises(ConfigError, match=f"model: {kind}: .*{message}"):
        ppo.build(ppo.Params(), gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), model)


def test_two_variables_of_one_name_are_refused():
    module = tf.Module()
    module.a = tf.Variable(1.0, name="pi/w")
    module.b = tf.Variable(2.0, name="pi/w")
    with pytest.raises(ValueError, match="two variables are named 'pi/w'"):
        named_variables(module)


def test_compiled_call_converts_checks_and_matches_the_function():
    """`Compiled` calls the concrete function's flat entry point: numpy inputs of another
    dtype are converted to the signature's, a shape outside the signature is refused, the
    result equals the tf.function's, and nothing retraces."""
    from easyrl.models.flat import Compiled

    v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    def fn(x, k):
        return tf.matmul(x, v) * tf.cast(k, tf.float32)[:, None], tf.reduce_sum(x, axis=1)

    spec = (tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None], tf.int64))
    compiled = Compiled(fn, *spec)
    x = np.array([[1.0, 0.0], [0.5, 2.0]])  # float64: converted
    out, total = compiled(x, np.array([1, 2]))
    ref_out, ref_total = tf.function(fn)(tf.constant(x, tf.float32), tf.constant([1, 2], tf.int64))
    np.testing.assert_allclose(out.numpy(), ref_out.numpy())
    np.testing.assert_allclose(total.numpy(), ref_total.numpy())
    v.assign([[0.0, 0.0], [0.0, 1.0]])  # captured variables are read at call time
    assert compiled(x, np.array([1, 1]))[0].numpy().tolist() == [[0.0, 0.0], [0.0, 2.0]]
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        compiled(np.zeros((2, 3), np.float32), np.array([1, 1]))
    with pytest.raises(TypeError, match="expected 2 arguments"):
        compiled(x)
    compiled(np.zeros((5, 2), np.float32), np.arange(5))  # another batch size
    assert compiled.experimental_get_tracing_count() == 1
