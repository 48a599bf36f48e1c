"""Dict/Tuple observations flattened at the env boundary, and action masks: the layout, the
masking algorithms' acting (greedy and exploring) and losses, the refusal of the others,
per-key encoders (`model.encoders`), and a real-roles run on `easyrl/MaskedChoice-v0` that
never takes an illegal action."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from easyrl import api
from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.algorithms.agent_parts import greedy_policy
from easyrl.algorithms.masking import ILLEGAL
from easyrl.config import EncoderConfig, ModelConfig
from easyrl.envs import env_spaces, final_observations, make_vector_env
from easyrl.envs.evaluation import Stateless, play_episodes
from easyrl.envs.flat import FlatBox, FlatObservation, action_mask_size, observation_parts
from easyrl.envs.masked import ENV_ID, EPISODE_STEPS, MaskedChoice
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models import EncoderTorso
from tests.test_cluster import launch  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent
MODEL = ModelConfig(hidden=(16,), activation="tanh")

# Small settings of every masking algorithm (an unroll, a round or a batch fills quickly).
MASKING = {
    "dqn": {"batch_size": 8, "n_step": 2},
    "impala": {"unroll_length": 4, "batch_size": 2},
    "a3c": {"unroll_length": 4},
    "ppo": {"rollout_length": 4, "minibatch_size": 8, "num_epochs": 1},
    "a2c": {"rollout_length": 4},
    "pg": {"rollout_length": 4},
}


class NestedEnv(MaskedChoice):
    """MaskedChoice with more parts around its mask: a Discrete, a nested Tuple."""

    def __init__(self):
        super().__init__(num_actions=3)
        self.observation_space = spaces.Dict(
            {
                "z": spaces.Discrete(3),
                "action_mask": spaces.MultiBinary(3),
                "payoff": spaces.Box(0.0, 1.0, (3,), np.float32),
                "a": spaces.Tuple((spaces.Box(-2.0, 2.0, (2,), np.float32), spaces.Discrete(2))),
            }
        )

    def _draw(self):
        obs = super()._draw()
        obs.update(z=np.int64(2), a=(np.array([-1.5, 0.5], np.float32), np.int64(1)))
        return obs


class ImageEnv(MaskedChoice):
    """MaskedChoice over 3 actions with a uint8 image and a Discrete beside its payoffs (and
    its action mask, unless `mask` is false)."""

    def __init__(self, mask: bool = True):
        super().__init__(num_actions=3)
        parts = {
            "payoff": spaces.Box(0.0, 1.0, (3,), np.float32),
            "z": spaces.Discrete(3),
            "image": spaces.Box(0, 255, (6, 6, 2), np.uint8),
        }
        if mask:
            parts["action_mask"] = spaces.MultiBinary(3)
        self.observation_space = spaces.Dict(parts)

    def _draw(self):
        obs = super()._draw()
        obs.update(z=np.int64(1), image=self.np_random.integers(0, 256, (6, 6, 2), np.uint8))
        return obs


IMAGE_ENV = "tests.test_dict_obs:ImageEnv"
# A conv encoder on the image and an MLP on the payoffs; z (one-hot, 3) passes on flat.
ENCODED = ModelConfig(
    hidden=(16,),
    activation="tanh",
    encoders={
        "image": EncoderConfig(kind="conv", conv=((4, 3, 1),), hidden=(8,)),
        "payoff": EncoderConfig(hidden=(4,)),
    },
)


def build(name: str, seed: int = 0, model: ModelConfig = MODEL, env_id=ENV_ID, **extra):
    """Algorithm `name` built on the flat spaces of `env_id` (MaskedChoice) with its `MASKING`
    settings."""
    obs_space, action_space = env_spaces(env_id)
    params = registry.params_class(name)(**{**MASKING.get(name, {}), **extra})
    return registry.module(name).build(params, obs_space, action_space, model, seed)


def legal(obs: np.ndarray, actions: np.ndarray, n: int = 5) -> np.ndarray:
    """Whether each action `[N]` is legal in its flat observation `[N, D]` (mask of `n` last)."""
    return obs[np.arange(len(obs)), obs.shape[1] - n + np.asarray(actions)] > 0.5


def run_collector(
    algo, steps: int, num_envs: int = 4, seed: int = 0, env_id: str = ENV_ID
) -> list[dict]:
    """Steps `env_id` (MaskedChoice) through `algo`'s collector; asserts every action is legal
    (and so no reward is negative); returns the items the collector completed."""
    n = action_mask_size(env_spaces(env_id)[0])
    env = make_vector_env(env_id, num_envs, seed=seed)
    collector = algo.collector(num_envs, seed, 0, 1)
    if algo.flow == "sync_rounds":
        collector.start_round()
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(steps):
        actions = collector.act(obs, rng)
        assert legal(obs, actions, n).all(), (obs, actions)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        assert (rewards >= 0).all()
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        item = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        if item is not None:
            items.append(item)
            if algo.flow == "sync_rounds":
                collector.start_round()
        obs = next_obs
    env.close()
    return items


# --- the flat layout -------------------------------------------------------------------------


def test_a_dict_observation_flattens_in_sorted_key_order_with_the_mask_last():
    env = FlatObservation(NestedEnv())
    space = env.observation_space
    assert isinstance(space, FlatBox) and space.dtype == np.float32
    assert space.mask_size == action_mask_size(space) == 3
    # a: Box(2) + one-hot Discrete(2); payoff: 3; z: one-hot Discrete(3); then the mask (3).
    assert space.shape == (2 + 2 + 3 + 3 + 3,)
    np.testing.assert_array_equal(space.low, [-2, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(space.high, [2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    flat, _ = env.reset(seed=3)
    raw = env.unwrapped._obs  # the Dict the wrapped env observed
    np.testing.assert_array_equal(flat[:4], [-1.5, 0.5, 0, 1])  # a: Box, then Discrete 1
    np.testing.assert_array_equal(flat[4:7], raw["payoff"])
    np.testing.assert_array_equal(flat[7:10], [0, 0, 1])  # z = 2
    np.testing.assert_array_equal(flat[10:], raw["action_mask"])
    # Round trip: the features unflatten to the Dict's other parts.
    back = spaces.unflatten(env.features, flat[:-3])
    assert int(back["z"]) == 2 and int(back["a"][1]) == 1
    np.testing.assert_allclose(back["payoff"], raw["payoff"])
    np.testing.assert_allclose(back["a"][0], [-1.5, 0.5])


def test_a_tuple_or_a_dict_without_mask_flattens_with_no_mask():
    class TupleEnv(MaskedChoice):
        def __init__(self):
            super().__init__()
            self.observation_space = spaces.Tuple(
                (spaces.Box(0.0, 1.0, (5,), np.float32), spaces.MultiBinary(5))
            )

        def _draw(self):
            obs = super()._draw()
            return (obs["payoff"], obs["action_mask"])

    env = FlatObservation(TupleEnv())
    assert env.observation_space.shape == (10,) and action_mask_size(env.observation_space) == 0
    flat, _ = env.reset(seed=0)
    payoff, mask = env.unwrapped._obs["payoff"], env.unwrapped._obs["action_mask"]
    np.testing.assert_array_equal(flat, np.concatenate([payoff, mask]).astype(np.float32))
    assert action_mask_size(spaces.Box(0.0, 1.0, (3,))) == 0  # a plain Box has none


@pytest.mark.parametrize(
    "mask, actions, message",
    [
        (spaces.MultiBinary(4), 5, "needs a Discrete\\(4\\) action space"),
        (spaces.Box(0.0, 2.0, (5,)), 5, "must be MultiBinary"),
        (spaces.MultiBinary((5, 1)), 5, "must be MultiBinary"),
    ],
)
def test_a_malformed_action_mask_is_refused(mask, actions, message):
    env = MaskedChoice(num_actions=actions)
    env.observation_space = spaces.Dict({"x": spaces.Box(0, 1, (2,)), "action_mask": mask})
    with pytest.raises(ConfigError, match=message):
        FlatObservation(env)
    env.observation_space = spaces.Dict({"action_mask": spaces.MultiBinary(actions)})
    with pytest.raises(ConfigError, match="nothing but its 'action_mask'"):
        FlatObservation(env)


def test_every_env_easyrl_builds_observes_the_same_flat_vectors():
    obs_space, action_space = env_spaces(ENV_ID)
    assert isinstance(obs_space, FlatBox) and obs_space.shape == (10,)
    assert obs_space.mask_size == 5 and action_space == spaces.Discrete(5)
    env = make_vector_env(ENV_ID, 3, seed=1)
    assert env.single_observation_space == obs_space
    obs, _ = env.reset(seed=1)
    assert obs.shape == (3, 10) and obs.dtype == np.float32
    illegal = np.argmin(obs[:, 5:], axis=1)  # an illegal action where a row has one
    has_illegal = obs[:, 5:].min(axis=1) < 0.5
    _, rewards, terminated, _, infos = env.step(illegal)
    np.testing.assert_array_equal(terminated, has_illegal)
    np.testing.assert_array_equal(rewards[has_illegal], -10.0)
    real = final_observations(obs, infos, terminated)  # the final observation is flat too
    np.testing.assert_array_equal(real[has_illegal], obs[has_illegal])
    env.close()


@pytest.mark.cluster
def test_async_envs_flatten_in_their_subprocesses_as_the_parent_does():
    env = make_vector_env(ENV_ID, 2, vector="async", seed=4)
    try:
        assert isinstance(env.single_observation_space, FlatBox)
        assert env.single_observation_space.mask_size == 5
        obs, _ = env.reset(seed=4)
        assert obs.shape == (2, 10) and obs.dtype == np.float32
        assert (obs[:, 5:].max(axis=1) == 1.0).all()  # a legal action in every row
    finally:
        env.close()


# --- acting never takes a masked action --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MASKING))
def test_acting_and_greedy_play_never_take_a_masked_action(name):
    assert registry.spec(name).action_masks
    algo = build(name, **({"epsilon": 1.0} if name == "dqn" else {}))
    # The network sees the 5 payoffs, not the mask: its first layer has 5 inputs.
    first = [v for n, v in algo.variables.items() if "torso" in n and v.shape.rank == 2]
    assert first and all(v.shape[0] == 5 for v in first[:1]), list(algo.variables)
    run_collector(algo, steps=60)  # asserts every sampled / explored action is legal
    rng = np.random.default_rng(7)
    obs = np.concatenate([rng.random((500, 5)), rng.random((500, 5)) < 0.3], axis=1)
    obs[np.arange(500), 5 + rng.integers(5, size=500)] = 1.0  # at least one legal each
    obs = obs.astype(np.float32)
    assert legal(obs, algo.greedy(obs)).all()
    # The same untrained network without the mask picks illegal actions: the test can fail.
    unmasked = obs.copy()
    unmasked[:, 5:] = 1.0
    assert not legal(obs, algo.greedy(unmasked)).all()
    returns, lengths = play_episodes(
        make_vector_env(ENV_ID, 2, seed=2), Stateless(algo.greedy), 3, seed=2
    )
    assert lengths == [EPISODE_STEPS] * 3 and min(returns) >= 0


def test_dqn_explores_uniformly_among_legal_actions_and_reports_their_probability():
    algo = build("dqn")
    obs = np.zeros((4000, 10), np.float32)
    obs[:, 5 + 1] = obs[:, 5 + 3] = 1.0  # actions 1 and 3 legal
    actions, logp = algo.act_with_logp(obs, 1.0, np.random.default_rng(0))
    counts = np.bincount(actions, minlength=5)
    assert counts[[0, 2, 4]].sum() == 0 and abs(counts[1] - 2000) < 150
    np.testing.assert_allclose(np.exp(logp), 0.5, rtol=1e-6)  # epsilon 1: 1 / 2 legal
    obs[0, 5:] = 0.0
    with pytest.raises(EasyRLError, match="no legal action"):
        algo.act_with_logp(obs, 0.5, np.random.default_rng(0))


def test_dqn_bootstraps_from_the_best_legal_next_action():
    algo = build("dqn", double_q=False)
    next_obs = np.zeros((1, 10), np.float32)
    next_obs[0, :5] = np.linspace(0.0, 1.0, 5)
    q_next = algo.target(tf.constant(next_obs)).numpy()[0]  # [A]
    for legal_set in ([0], [2, 4], [1, 3]):
        next_obs[0, 5:] = 0.0
        next_obs[0, [5 + a for a in legal_set]] = 1.0
        inputs = algo.step_inputs(
            {
                "obs": next_obs,
                "action": np.array([0]),
                "reward": np.array([1.0], np.float32),
                "next_obs": next_obs,
                "discount": np.array([0.5], np.float32),
            },
            np.ones(1, np.float32),
        )
        y = algo._targets(*(tf.constant(x) for x in inputs[2:5])).numpy()[0]
        assert y == pytest.approx(1.0 + 0.5 * q_next[legal_set].max(), rel=1e-6)


@pytest.mark.parametrize(
    "switches", [{"num_atoms": 11, "v_min": 0.0, "v_max": 1.0}, {"noisy_sigma": 0.5}]
)
def test_dqn_with_rainbow_switches_acts_and_learns_within_the_mask(switches):
    algo = build("dqn", seed=3, epsilon=0.0, double_q=True, **switches)
    items = run_collector(algo, steps=10)  # greedy (or noisy) acting: every action legal
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    _finite(algo.learn(batch, np.ones(len(batch["action"]), np.float32)))


# --- the losses stay finite ------------------------------------------------------------------


def _finite(step) -> None:
    for g in step.grads:
        assert g is None or np.isfinite(g).all()
    assert all(np.isfinite(v) for v in step.stats.values()), step.stats


@pytest.mark.parametrize("name", sorted(MASKING))
def test_the_loss_and_its_gradients_stay_finite_with_masks(name):
    algo = build(name, seed=1)
    items = run_collector(algo, steps=12)
    assert items
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    if algo.flow == "sync_rounds":
        steps = list(algo.learn_round(batch, np.random.default_rng(0)))
        assert steps and all(s.stats["entropy"] > 0 for s in steps)
        for step in steps:
            _finite(step)
        return
    step = algo.learn(batch, np.ones(len(batch["action"]), np.float32))
    _finite(step)
    if "logits" in batch:  # IMPALA/A3C ship masked behaviour logits: illegal ones are ILLEGAL
        obs = batch["obs"][:, :-1]  # [B, T, 10]
        illegal = obs[..., 5:] < 0.5
        assert illegal.any() and (batch["logits"][illegal] == ILLEGAL).all()
        assert step.stats["entropy"] > 0


@pytest.mark.parametrize("name", ["impala", "ppo"])
def test_recurrent_policies_mask_their_actions_and_losses_too(name):
    algo = build(name, seed=2, model=ModelConfig(hidden=(16,), activation="tanh", lstm=8))
    assert algo.state_size > 0
    items = run_collector(algo, steps=12)  # asserts every sampled action is legal
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    if algo.flow == "sync_rounds":
        for step in algo.learn_round(batch, np.random.default_rng(0)):
            _finite(step)
    else:
        _finite(algo.learn(batch, None))
    returns, lengths = play_episodes(
        make_vector_env(ENV_ID, 2, seed=3), greedy_policy(algo, recurrent=True), 3, seed=3
    )
    assert lengths == [EPISODE_STEPS] * 3 and min(returns) >= 0


@pytest.mark.parametrize("name", ["impala", "ppo"])
def test_an_observation_with_no_legal_action_is_an_error_not_a_random_action(name):
    algo = build(name)
    collector = algo.collector(2, 0, 0, 1)
    if algo.flow == "sync_rounds":
        collector.start_round()
    obs = np.zeros((2, 10), np.float32)
    obs[:, 5] = 1.0
    obs[1, 5] = 0.0  # row 1: every entry of its mask 0
    with pytest.raises(EasyRLError, match="no legal action"):
        collector.act(obs, np.random.default_rng(0))


# --- per-key encoders ---------------------------------------------------------------------------


def test_the_parts_say_where_each_key_lies_in_the_flat_vector():
    env = FlatObservation(ImageEnv())
    parts = observation_parts(env.observation_space)
    assert [(p.key, p.shape) for p in parts] == [
        ("image", (6, 6, 2)),
        ("payoff", (3,)),
        ("z", (3,)),  # a Discrete: its one-hot
    ]
    assert [p.start for p in parts] == [0, 72, 75] and parts[-1].stop == 78
    flat, _ = env.reset(seed=1)
    raw = env.unwrapped._obs
    for part in parts[:2]:  # the Boxes come back in their own shape
        np.testing.assert_array_equal(
            flat[part.start : part.stop].reshape(part.shape), raw[part.key]
        )
    np.testing.assert_array_equal(flat[75:78], [0, 1, 0])
    tuple_space = FlatObservation(NestedEnv()).observation_space
    assert [p.key for p in observation_parts(tuple_space)] == ["a", "payoff", "z"]
    assert observation_parts(spaces.Box(0.0, 1.0, (3,))) == ()


def _encoder_torsos(algo) -> list[EncoderTorso]:
    modules = [m for m in vars(algo).values() if isinstance(m, tf.Module)]
    found = {id(s): s for m in modules for s in (m, *m.submodules) if isinstance(s, EncoderTorso)}
    return list(found.values())


@pytest.mark.parametrize("name", [*sorted(MASKING), "r2d2"])
def test_per_key_encoders_read_their_keys_in_their_own_shape(name):
    recurrent = name == "r2d2"  # it needs an LSTM, and cannot honour a mask
    model = ModelConfig(**{**vars(ENCODED), "lstm": 8 if recurrent else 0})
    env_id = "tests.test_dict_obs:ImageEnvNoMask" if recurrent else IMAGE_ENV
    extra = {"burn_in": 1, "learn_length": 3, "period": 2, "batch_size": 2} if recurrent else {}
    algo = build(name, seed=4, model=model, env_id=env_id, **extra)
    shapes = {n: tuple(v.shape) for n, v in algo.variables.items()}
    torso = next(n.removesuffix("/image/conv0/w") for n in shapes if n.endswith("image/conv0/w"))
    assert shapes[f"{torso}/image/conv0/w"] == (3, 3, 2, 4)
    assert shapes[f"{torso}/payoff/0/w"] == (3, 4)
    assert shapes[f"{torso}/0/w"] == (8 + 4 + 3, 16)  # the torso on the encoders' features

    obs_space, _ = env_spaces(env_id)
    rng = np.random.default_rng(0)
    obs = np.stack([obs_space.sample() for _ in range(5)]).astype(np.float32)  # [5, D]
    obs[:, :72] = rng.integers(0, 256, (5, 72))
    for module in _encoder_torsos(algo):
        image = obs[:, :72].reshape(5, 6, 6, 2)
        features = [module.encoders["image"](image), module.encoders["payoff"](obs[:, 72:75])]
        expected = module.torso(tf.concat([*features, obs[:, 75:78]], axis=1))
        np.testing.assert_allclose(module(obs[:, :78]), expected, rtol=1e-5, atol=1e-6)
    assert _encoder_torsos(algo)

    if recurrent:
        return
    items = run_collector(algo, steps=12, env_id=env_id)  # every action legal
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    if algo.flow == "sync_rounds":
        step = next(iter(algo.learn_round(batch, np.random.default_rng(0))))
    else:
        step = algo.learn(batch, np.ones(len(batch["action"]), np.float32))
    _finite(step)
    grads = dict(zip(algo.variables, step.grads, strict=True))
    assert np.abs(grads[f"{torso}/image/conv0/w"]).sum() > 0  # the loss reaches the encoders


def test_an_mlp_encoder_reads_its_keys_entries_flat_whatever_their_shape():
    parts = observation_parts(FlatObservation(ImageEnv()).observation_space)
    model = ModelConfig(hidden=(8,), encoders={"image": EncoderConfig(hidden=(4,))})
    torso = EncoderTorso(model, parts, "t", np.random.default_rng(0))
    names = {v.name.removesuffix(":0"): tuple(v.shape) for v in torso.trainable_variables}
    assert names["t/image/0/w"] == (72, 4) and names["t/0/w"] == (4 + 3 + 3, 8)
    assert torso(np.zeros((2, 78), np.float32)).shape == (2, 8)


class ImageEnvNoMask(ImageEnv):
    """`ImageEnv` without its action mask."""

    def __init__(self):
        super().__init__(mask=False)


@pytest.mark.parametrize(
    "model, algorithm, env_id, message",
    [
        (
            {"encoders": {"payof": {"hidden": [4]}}},
            "ppo",
            ENV_ID,
            "model.encoders.payof: the observations have no key 'payof'; did you mean 'payoff'",
        ),
        (
            {"encoders": {"x": {}}},
            "dqn",
            "CartPole-v1",
            "model.encoders: the observations are not a Dict or a Tuple",
        ),
        (
            {"encoders": {"payoff": {}}},
            "sac",
            "Pendulum-v1",
            "model.encoders: sac has no per-key encoders \\(algorithms with them: a2c, a3c, dqn, "
            "impala, pg, ppo, r2d2\\)",
        ),
        ({"kind": "conv", "encoders": {"payoff": {}}}, "ppo", ENV_ID, "not conv"),
        ({"encoders": {"payoff": {"hidden": [0]}}}, "ppo", ENV_ID, "model.encoders.payoff.hidden"),
    ],
)
def test_a_bad_encoder_config_names_the_key_before_anything_starts(
    model, algorithm, env_id, message
):
    with pytest.raises(ConfigError, match=message):
        cfg = config_lib.from_dict(
            {"algorithm": {"name": algorithm}, "env": {"id": env_id}, "model": model}
        )
        api.check_builds(cfg)


# --- algorithms that cannot mask refuse -------------------------------------------------------


@pytest.mark.parametrize("name", ["es", "sac", "bcq"])
def test_an_algorithm_that_cannot_mask_refuses_a_masked_env(name):
    obs_space, _ = env_spaces(ENV_ID)
    with pytest.raises(ConfigError, match=f"which {name} cannot honour; algorithms that can"):
        registry.check_spaces(name, ENV_ID, obs_space)
    registry.check_spaces(name, ENV_ID, spaces.Box(0.0, 1.0, (10,)))  # no mask: fine


def test_a_config_with_a_masked_env_and_es_fails_before_anything_starts():
    cfg = config_lib.from_dict({"algorithm": {"name": "es"}, "env": {"id": ENV_ID}})
    message = "algorithms that can: a2c, a3c, dqn, impala, pg, ppo"
    with pytest.raises(ConfigError, match=message):
        api.check_builds(cfg)
    assert registry.masking() == ["a2c", "a3c", "dqn", "impala", "pg", "ppo"]


# --- real roles -------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "config, overrides",
    [
        ("masked_choice_dqn.yaml", ("replay.min_size_to_sample=200", "algorithm.epsilon=0.5")),
        ("masked_choice_ppo.yaml", ("model.encoders.payoff.hidden=[8]",)),  # an encoder
    ],
)
def test_real_roles_train_on_a_masked_env_without_an_illegal_action(
    launch,  # noqa: F811
    tmp_path,
    config,
    overrides,
):
    from easyrl.offline.dataset import read_steps

    data = tmp_path / "data"
    run = launch(
        "stop.max_env_steps=2000",
        "stop.max_seconds=90",
        "cluster.actor=1",
        "cluster.evaluator=0",
        "run.log_interval_s=0.5",
        f"output.dir={data}",  # the actor records every step it takes
        *overrides,
        config=ROOT / "configs" / config,
        base=("stop.eval_return_mean=null",),  # the step budget is the goal: exit 0
    )
    assert run.wait(150) == 0, run.output() + run.logs()
    counters = run.summary()["servers"]["ps/0"]["counters"]
    assert counters["env_steps"] >= 2000 and counters["updates"] > 0, counters
    assert counters["episodes"] > 0
    steps = read_steps(data)  # the steps of whole episodes, with their flat observations
    assert len(steps["action"]) >= 1000
    assert legal(steps["obs"], steps["action"]).all()
    assert (steps["reward"] >= 0).all() and not steps["terminated"].any()
    if any(o.startswith("model.encoders") for o in overrides):  # the PS holds the encoder's
        with np.load(run.run_dir / "checkpoints" / "ps-0.npz") as data:
            assert {"var/pi/torso/payoff/0/w", "var/vf/torso/payoff/0/w"} <= set(data.files)
