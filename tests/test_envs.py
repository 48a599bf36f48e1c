"""Tests of easyrl.envs: vector env creation and the same-step autoreset convention."""

import gymnasium
import numpy as np
import pytest

from easyrl.envs import env_spaces, final_observations, make_vector_env
from easyrl.errors import ConfigError, EasyRLError


def test_sync_same_step_final_observations():
    env = make_vector_env("CartPole-v1", 4, seed=3)
    try:
        assert isinstance(env, gymnasium.vector.SyncVectorEnv)
        assert env.num_envs == 4
        obs, _ = env.reset(seed=3)
        done = np.zeros(4, bool)
        for _ in range(500):
            obs, _, terminated, truncated, infos = env.step(env.action_space.sample())
            done = terminated | truncated
            if done.any():
                break
        assert done.any()
        true_next = final_observations(obs, infos, done)
        assert true_next is not obs and true_next.dtype == obs.dtype
        for i in range(4):
            if done[i]:
                np.testing.assert_array_equal(true_next[i], infos["final_obs"][i])
                # The returned row is already the reset observation (uniform in +-0.05) ...
                assert np.all(np.abs(obs[i]) <= 0.05)
                # ... while the final one left CartPole's bounds (a termination).
                x, _, theta, _ = true_next[i]
                assert terminated[i] and (abs(x) > 2.4 or abs(theta) > 0.2095)
            else:
                np.testing.assert_array_equal(true_next[i], obs[i])
    finally:
        env.close()


def test_final_observations_no_done_and_missing_final():
    obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = final_observations(obs, {}, np.zeros(3, bool))
    np.testing.assert_array_equal(out, obs)
    assert out is not obs
    with pytest.raises(EasyRLError):
        final_observations(obs, {}, np.array([True, False, False]))
    with pytest.raises(EasyRLError):
        final_observations(obs, {}, np.zeros(2, bool))


def test_max_episode_steps_truncates():
    env = make_vector_env("CartPole-v1", 2, max_episode_steps=3)
    try:
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.zeros(2, np.int64))
        obs, _, terminated, truncated, infos = env.step(np.zeros(2, np.int64))
        assert truncated.all() and not terminated.any()
        true_next = final_observations(obs, infos, truncated)
        assert not np.array_equal(true_next, obs)
    finally:
        env.close()


def test_unknown_env_id_suggests_close_ids():
    with pytest.raises(ConfigError) as info:
        make_vector_env("CartPol-v1", 2)
    assert "CartPol-v1" in str(info.value)
    assert "CartPole-v1" in str(info.value)
    with pytest.raises(ConfigError):
        env_spaces("CartPol-v1")


def test_argument_checks():
    with pytest.raises(ConfigError):
        make_vector_env("CartPole-v1", 2, vector="threads")
    with pytest.raises(ConfigError):
        make_vector_env("CartPole-v1", 0)
    with pytest.raises(ConfigError):
        make_vector_env("CartPole-v1", 2, max_episode_steps=0)
    with pytest.raises(ConfigError):
        make_vector_env("CartPole-v1", 2, kwargs=["x"])


def test_env_spaces():
    obs_space, action_space = env_spaces("CartPole-v1")
    assert obs_space.shape == (4,)
    assert isinstance(action_space, gymnasium.spaces.Discrete) and action_space.n == 2


@pytest.mark.cluster
def test_async_steps_and_closes():
    env = make_vector_env("CartPole-v1", 2, vector="async", seed=1)
    try:
        assert isinstance(env, gymnasium.vector.AsyncVectorEnv)
        obs, _ = env.reset(seed=1)
        assert obs.shape == (2, 4)
        for _ in range(5):
            obs, reward, terminated, truncated, infos = env.step(env.action_space.sample())
            assert obs.shape == (2, 4) and reward.shape == (2,)
    finally:
        env.close()
    assert env.closed


@pytest.mark.cluster  # importing mujoco runs a child Python (a library version probe)
@pytest.mark.parametrize(
    "env_id",
    ["LunarLanderContinuous-v3", "HalfCheetah-v5", "Hopper-v5", "ALE/Breakout-v5"],
)
def test_every_env_family_with_an_extra_makes_and_steps(env_id):
    """The `box2d`, `mujoco` and `atari` extras (which the `test` extra installs too) make
    and step their envs through easyrl, and a missing package names the extra."""
    from easyrl.envs import extra_for
    from easyrl.envs.atari import register_ale

    register_ale()

    assert extra_for(gymnasium.spec(env_id)) in ("box2d", "mujoco", "atari")
    atari = None
    if env_id.startswith("ALE/"):
        from easyrl.config import AtariConfig

        atari = AtariConfig()
    env = make_vector_env(env_id, num_envs=2, vector="sync", seed=0, atari=atari)
    try:
        obs, _ = env.reset(seed=0)
        for _ in range(3):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs.shape[0] == 2 and np.all(np.isfinite(reward))
    finally:
        env.close()


def test_a_missing_env_package_names_the_extra_that_installs_it(monkeypatch):
    import easyrl.envs

    def missing(*args, **kwargs):
        raise gymnasium.error.DependencyNotInstalled("pygame is not installed")

    monkeypatch.setattr(easyrl.envs, "_make_one", missing)
    with pytest.raises(
        ConfigError, match=r"pygame is not installed; pip install 'easyrl\[box2d\]'"
    ):
        env_spaces("LunarLanderContinuous-v3")
