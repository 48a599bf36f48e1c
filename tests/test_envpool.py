"""Tests of `env.vector: envpool` (easyrl.envs.pool): the same spaces, frames and same-step
autoreset convention as the gymnasium vector envs, seeding, clear errors, and a real Pong
IMPALA run whose actor steps EnvPool."""

import dataclasses
import sys

import numpy as np
import pytest
from test_cluster import ROOT, _assert_no_processes_left, _counters, launch, one_each  # noqa: F401

from easyrl import api
from easyrl import config as config_lib
from easyrl.config import AtariConfig
from easyrl.envs import VECTOR_MODES, final_observations, game_steps, make_vector_env
from easyrl.envs.pool import ALE_V5_DEFAULTS, EnvPoolVectorEnv, pool_task, supported_ids
from easyrl.errors import ConfigError
from easyrl.roles.actor import EpisodeTracker

# Deterministic Atari: one no-op frame per reset and no sticky actions, so both backends play
# exactly the same frames.
NO_RANDOMNESS = {"kwargs": {"repeat_action_probability": 0.0}}


def _pair(env_id: str, num_envs: int, **options):
    """(the gymnasium sync vector env, the EnvPool one) for the same config."""
    sync = make_vector_env(env_id, num_envs, vector="sync", seed=0, **options)
    pool = make_vector_env(env_id, num_envs, vector="envpool", seed=0, **options)
    return sync, pool


def test_envpool_is_a_vector_mode():
    assert VECTOR_MODES == ("sync", "async", "envpool")
    ids = supported_ids()
    assert {"ALE/Pong-v5", "ALE/Breakout-v5", "CartPole-v1", "Pendulum-v1"} <= set(ids)
    assert "LunarLander-v3" not in ids and "Pong-v5" not in ids


@pytest.mark.parametrize("screen_size,grayscale", [(42, True), (84, False)])
def test_pong_frames_equal_the_gymnasium_pipeline(screen_size, grayscale):
    atari = AtariConfig(screen_size=screen_size, grayscale=grayscale, noop_max=1)
    sync, pool = _pair("ALE/Pong-v5", 2, atari=atari, **NO_RANDOMNESS)
    try:
        assert isinstance(pool, EnvPoolVectorEnv)
        assert pool.single_observation_space == sync.single_observation_space
        assert pool.single_action_space == sync.single_action_space
        assert pool.observation_space == sync.observation_space
        assert pool.action_space == sync.action_space
        channels = 4 if grayscale else 12
        assert pool.single_observation_space.shape == (screen_size, screen_size, channels)
        expected, _ = sync.reset(seed=0)
        obs, infos = pool.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.flags.c_contiguous and infos == {}
        # The reset stack repeats the reset frame k times in both (FrameStackObservation's
        # "reset" padding, EnvPool's push_all).
        np.testing.assert_array_equal(obs, expected)
        rng = np.random.default_rng(0)
        for _ in range(150):
            actions = rng.integers(0, 6, size=2)
            want = sync.step(actions)
            got = pool.step(actions)
            for a, b in zip(want[:4], got[:4]):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)
    finally:
        sync.close()
        pool.close()


def test_episodic_life_ends_the_episode_and_the_game_goes_on():
    # Breakout has 5 lives: a lost life terminates the episode, and in both backends the next
    # episode goes on with the same game from the same observation (DeepMind's episodic
    # life); the infos keep the game's raw score and end (`game_steps`).
    atari = AtariConfig(screen_size=42, noop_max=1, episodic_life=True)
    sync, pool = _pair("ALE/Breakout-v5", 1, atari=atari, **NO_RANDOMNESS)
    try:
        sync.reset(seed=0)
        pool.reset(seed=0)
        rng = np.random.default_rng(2)  # a game that scores
        lost, score = 0, 0.0
        for step in range(3000):
            actions = rng.integers(0, 4, size=1)
            want = sync.step(actions)
            got = pool.step(actions)
            for a, b in zip(want[:4], got[:4]):
                np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
            game = game_steps(got[4], 1)
            assert game is not None
            np.testing.assert_array_equal(game, game_steps(want[4], 1))
            score += game[0][0]
            if got[2][0]:
                assert got[4]["_final_obs"][0]
                if game[1][0]:  # the last life: a new game starts
                    break
                lost += 1
                # the next episode starts where the last one ended
                np.testing.assert_array_equal(got[0][0], got[4]["final_obs"][0])
        assert lost == 4 and game[1][0], (lost, step)
        assert score > 0
        for _ in range(20):  # both started a new game alike
            actions = rng.integers(0, 4, size=1)
            np.testing.assert_array_equal(pool.step(actions)[0], sync.step(actions)[0])
    finally:
        sync.close()
        pool.close()


@pytest.mark.parametrize("vector", ["sync", "envpool"])
def test_fire_reset_serves_the_ball(vector):
    # Breakout waits for FIRE: with NOOPs only, no life is ever lost unless the reset fired.
    for fire_reset in (False, True):
        atari = AtariConfig(screen_size=42, noop_max=1, fire_reset=fire_reset)
        env = make_vector_env("ALE/Breakout-v5", 1, vector=vector, seed=0, atari=atari)
        try:
            env.reset(seed=0)
            ended = [env.step(np.zeros(1, np.int64))[2][0] for _ in range(300)]
            assert any(ended) == fire_reset, fire_reset
        finally:
            env.close()


@pytest.mark.parametrize("vector", ["sync", "envpool"])
def test_clipped_rewards_keep_the_raw_score_for_the_reports(vector):
    # SpaceInvaders scores 5 to 30 points an alien: the learner gets the sign, the actor's
    # EpisodeTracker (as `Actor.step` feeds it) the game's points.
    atari = AtariConfig(screen_size=42, noop_max=1, clip_rewards=True)
    env = make_vector_env("ALE/SpaceInvaders-v5", 2, vector=vector, seed=0, atari=atari)
    tracker, clipped = EpisodeTracker(2), 0.0
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(400):
            _, rewards, terminated, truncated, infos = env.step(rng.integers(0, 6, size=2))
            assert set(np.unique(rewards)) <= {0.0, 1.0}
            raw, over = game_steps(infos, 2)
            np.testing.assert_array_equal(raw > 0, rewards > 0)
            tracker.step(raw, over)
            clipped += rewards.sum()
        assert tracker.returns.sum() > clipped > 0  # the points, not the count of hits
    finally:
        env.close()


def test_cartpole_spaces_and_dtypes_equal_gymnasium():
    sync, pool = _pair("CartPole-v1", 3)
    try:
        assert pool.single_observation_space == sync.single_observation_space
        assert pool.single_action_space == sync.single_action_space
        assert pool.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"]
        want = sync.reset(seed=0)[0], *sync.step(np.ones(3, np.int64))[1:4]
        got = pool.reset(seed=0)[0], *pool.step(np.ones(3, np.int64))[1:4]
        for a, b in zip(want, got):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
    finally:
        sync.close()
        pool.close()


def test_same_step_autoreset_and_episode_returns():
    # Pushing left always ends a CartPole episode within a few dozen steps (a termination).
    env = make_vector_env("CartPole-v1", 3, vector="envpool", seed=3)
    tracker = EpisodeTracker(3)
    try:
        obs, _ = env.reset(seed=3)
        steps = np.zeros(3, np.int64)  # steps of the open episodes, counted here
        ended = []
        for _ in range(200):
            obs, rewards, terminated, truncated, infos = env.step(np.zeros(3, np.int64))
            np.testing.assert_array_equal(rewards, 1.0)
            assert not truncated.any()
            steps += 1
            done = terminated | truncated
            tracker.step(rewards, done)
            true_next = final_observations(obs, infos, done)
            for i in np.flatnonzero(done):
                assert infos["_final_obs"][i]
                np.testing.assert_array_equal(true_next[i], infos["final_obs"][i])
                x, _, theta, _ = true_next[i]
                assert abs(x) > 2.4 or abs(theta) > 0.2095  # the last state left the bounds
                assert np.all(np.abs(obs[i]) <= 0.05)  # obs[i] is already the reset state
                ended.append(int(steps[i]))
                steps[i] = 0
            if done.any():
                assert not infos["_final_obs"][~done].any()
                assert all(infos["final_obs"][i] is None for i in np.flatnonzero(~done))
            else:
                assert infos == {}
            if len(ended) >= 6:
                break
        returns, lengths, _ = tracker.take()
        assert len(ended) >= 6 and lengths == ended
        assert returns == [float(n) for n in ended]  # no extra reset step with reward 0
        assert all(5 <= n <= 60 for n in ended), ended
    finally:
        env.close()


def test_max_episode_steps_truncates():
    env = make_vector_env("CartPole-v1", 2, vector="envpool", max_episode_steps=3)
    try:
        env.reset(seed=0)
        for _ in range(2):
            assert not env.step(np.ones(2, np.int64))[3].any()
        obs, _, terminated, truncated, infos = env.step(np.ones(2, np.int64))
        assert truncated.all() and not terminated.any()
        assert not np.array_equal(final_observations(obs, infos, truncated), obs)
        assert not env.step(np.ones(2, np.int64))[3].any()  # a new 3-step episode
    finally:
        env.close()


def test_atari_step_limit_counts_frames_as_the_gymnasium_pipeline():
    atari = AtariConfig(frame_skip=4)
    task = pool_task("ALE/Pong-v5", max_episode_steps=41, atari=atari)
    assert task.options["max_episode_steps"] == 11  # ceil(41 frames / 4)
    task = pool_task("ALE/Pong-v5", atari=atari)
    assert task.options["max_episode_steps"] == 27_000  # ALE v5: 108,000 frames
    assert task.options["repeat_action_probability"] == 0.25 and task.options["noop_max"] == 30
    no_noops = pool_task("ALE/Pong-v5", atari=dataclasses.replace(atari, noop_max=0))
    assert no_noops.options["noop_max"] == 1  # EnvPool cannot run zero no-ops


def test_ale_v5_defaults_are_gymnasiums():
    from easyrl.envs import _resolve_spec

    kwargs = _resolve_spec("ALE/Pong-v5").kwargs
    for key, value in ALE_V5_DEFAULTS.items():
        assert kwargs[key] == value, key


def test_seeded_resets_are_reproducible():
    env = make_vector_env("CartPole-v1", 3, vector="envpool", seed=5)
    one = make_vector_env("CartPole-v1", 1, vector="envpool", seed=6)
    assert isinstance(env, EnvPoolVectorEnv)  # its reset takes a list of seeds too
    try:

        def rollout(seed):
            first, _ = env.reset(seed=seed)
            rows = [first]
            for _ in range(30):
                rows.append(env.step(np.ones(3, np.int64))[0])
            return np.stack(rows)

        a = rollout(5)  # the pool was made with seed 5: no rebuild
        b = rollout(5)  # rebuilt: the same episodes again
        c = rollout(6)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        # Sub-env i of seed s is seeded s + i.
        np.testing.assert_array_equal(one.reset(seed=6)[0][0], a[0, 1])
        np.testing.assert_array_equal(env.reset(seed=[6, 7, 8])[0], c[0])
        env.reset()  # no seed: the random streams go on
        with pytest.raises(ConfigError, match="seed must be None, an int or a list of 3 ints"):
            env.reset(seed=[1, 2])
        with pytest.raises(ConfigError, match="no options"):
            env.reset(options={"reset_mask": np.ones(3, bool)})
    finally:
        env.close()
        one.close()


def test_unsupported_ids_and_options_are_config_errors():
    with pytest.raises(ConfigError, match=r"did you mean 'CartPole-v1'.*ALE/<Game>-v5"):
        make_vector_env("CartPol-v1", 2, vector="envpool")
    with pytest.raises(ConfigError, match=r"did you mean 'ALE/Pong-v5'"):
        make_vector_env("ALE/Pongg-v5", 2, vector="envpool", atari=AtariConfig())
    with pytest.raises(ConfigError, match="does not support env id 'FrozenLake-v1'.*Acrobot-v1"):
        make_vector_env("FrozenLake-v1", 2, vector="envpool")
    with pytest.raises(ConfigError, match="Atari preprocessing only: set env.atari"):
        make_vector_env("ALE/Pong-v5", 2, vector="envpool")
    with pytest.raises(ConfigError, match="env.atari applies to ALE/ ids only"):
        make_vector_env("CartPole-v1", 2, vector="envpool", atari=AtariConfig())
    with pytest.raises(ConfigError, match=r"takes no env.kwargs for 'CartPole-v1'"):
        make_vector_env("CartPole-v1", 2, vector="envpool", kwargs={"sutton_barto_reward": True})
    with pytest.raises(ConfigError, match=r"cannot pass env.kwargs \['frameskip'\]"):
        make_vector_env(
            "ALE/Pong-v5", 2, vector="envpool", atari=AtariConfig(), kwargs={"frameskip": 4}
        )


def test_check_builds_rejects_an_id_envpool_cannot_run():
    cfg = config_lib.load(
        str(ROOT / "configs" / "cartpole_apex.yaml"), ["env.vector=envpool", "env.id=FrozenLake-v1"]
    )
    with pytest.raises(ConfigError, match="does not support env id 'FrozenLake-v1'"):
        api.check_builds(cfg)


def test_missing_envpool_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` now fails
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[envpool\]'"):
        make_vector_env("CartPole-v1", 2, vector="envpool")


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_pong_impala_run_with_envpool_actors(launch):  # noqa: F811
    run = launch(
        "env.vector=envpool",
        # Enough steps that the actor cannot spend them all into its outbox and the short
        # queue before the learner trains (see the uint8 test in test_cluster.py).
        "stop.max_env_steps=1500",
        "stop.max_seconds=150",
        "env.num_envs=2",
        "algorithm.unroll_length=16",
        "algorithm.batch_size=2",
        "replay.capacity=4",
        "replay.prefetch=1",
        "learner.updates_per_report=1",
        *one_each(),
        config=ROOT / "configs" / "pong_impala.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=1"),
    )
    code = run.wait(200)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    assert "vector: envpool" in run.config_path.read_text()
    ps0 = _counters(run.summary(), "ps/0")
    assert ps0["env_steps"] >= 1500 and ps0["ps/0/applied"] > 0, ps0
    logs = run.output() + "".join(
        p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*.log")
    )
    assert "Traceback" not in logs, logs
    _assert_no_processes_left(run.run_dir)
