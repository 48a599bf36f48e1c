"""Tests of easyrl.envs.workers: the `async` vector env with several envs per subprocess."""

import os
import signal

import gymnasium
import numpy as np
import pytest

from easyrl.config import from_dict
from easyrl.envs import make_vector_env
from easyrl.envs.workers import WorkerVectorEnv, merge_infos
from easyrl.errors import ConfigError, EasyRLError


def test_merge_infos_lays_each_workers_entries_at_its_envs():
    parts = [
        {"lives": np.array([3, 2]), "_lives": np.array([True, True])},
        {
            "final_obs": np.array([None, np.ones(2)], dtype=object),
            "_final_obs": np.array([False, True]),
            "final_info": {"lives": np.array([0, 1]), "_lives": np.array([False, True])},
        },
        {},
    ]
    merged = merge_infos(parts, [2, 2, 1])
    np.testing.assert_array_equal(merged["lives"], [3, 2, 0, 0, 0])
    np.testing.assert_array_equal(merged["_lives"], [True, True, False, False, False])
    np.testing.assert_array_equal(merged["_final_obs"], [False, False, False, True, False])
    assert merged["final_obs"].dtype == object
    assert [x is None for x in merged["final_obs"]] == [True, True, True, False, True]
    np.testing.assert_array_equal(merged["final_info"]["lives"], [0, 0, 0, 1, 0])
    np.testing.assert_array_equal(merged["final_info"]["_lives"], [0, 0, 0, 1, 0])


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        ({"vector": "sync", "envs_per_worker": 2}, "envs_per_worker applies to vector 'async'"),
        ({"vector": "async", "envs_per_worker": 0}, "env.envs_per_worker must be >= 1"),
    ],
)
def test_a_config_with_envs_per_worker_it_cannot_use_is_refused(sets, key):
    with pytest.raises(ConfigError, match=key):
        from_dict({"algorithm": {"name": "dqn"}, "env": {"id": "CartPole-v1", **sets}})
    with pytest.raises(ConfigError):
        make_vector_env("CartPole-v1", 4, envs_per_worker=sets["envs_per_worker"])


@pytest.mark.cluster
def test_workers_step_as_the_same_envs_in_process():
    """5 CartPoles in workers of 2 (2, 2, 1) give what a SyncVectorEnv of the same seeds
    gives, episode ends (final observations, infos) included."""
    ours = make_vector_env("CartPole-v1", 5, vector="async", seed=7, envs_per_worker=2)
    ref = make_vector_env("CartPole-v1", 5, vector="sync", seed=7)
    try:
        assert isinstance(ours, WorkerVectorEnv) and ours.sizes == [2, 2, 1]
        assert ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        obs, _ = ours.reset(seed=7)
        expected, _ = ref.reset(seed=7)
        np.testing.assert_array_equal(obs, expected)
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(150):
            actions = rng.integers(0, 2, 5)
            got, want = ours.step(actions), ref.step(actions)
            for a, b in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype
            assert set(got[4]) == set(want[4])
            if "_final_obs" in want[4]:
                np.testing.assert_array_equal(got[4]["_final_obs"], want[4]["_final_obs"])
                for i in np.flatnonzero(want[4]["_final_obs"]):
                    np.testing.assert_array_equal(got[4]["final_obs"][i], want[4]["final_obs"][i])
                    ends += 1
        assert ends >= 5  # episodes ended in every worker's envs along the way
    finally:
        ours.close()
        ref.close()
    assert ours.closed


@pytest.mark.cluster
def test_an_env_that_raises_or_a_worker_that_dies_raises_in_the_parent():
    env = make_vector_env("Pendulum-v1", 4, vector="async", seed=0, envs_per_worker=2)
    try:
        env.reset(seed=0)
        with pytest.raises(EasyRLError, match=r"env worker 0 raised .*\n"):
            env.step(np.full((4, 1, 1), np.nan))  # a wrong action shape: the env raises
        obs, _ = env.reset(seed=0)  # every worker's reply was read: the pipes are in step
        assert obs.shape == (4, 3)
        obs, *_ = env.step(np.zeros((4, 1), np.float32))
        assert obs.shape == (4, 3)
    finally:
        env.close()
    env = make_vector_env("CartPole-v1", 4, vector="async", seed=0, envs_per_worker=2)
    try:
        env.reset(seed=0)
        assert isinstance(env, WorkerVectorEnv)
        os.kill(env._processes[1].pid, signal.SIGKILL)
        with pytest.raises(EasyRLError, match=r"env worker 1 \(pid \d+\) exited with code -9"):
            for _ in range(3):
                env.step(np.zeros(4, np.int64))
    finally:
        env.close()


@pytest.mark.cluster
def test_an_env_that_cannot_be_built_in_a_worker_fails_the_constructor(monkeypatch):
    monkeypatch.setenv("EASYRL_TEST_PARENT", str(os.getpid()))  # the probe builds here only
    with pytest.raises(EasyRLError, match="env worker 0 raised RuntimeError: no env in this"):
        WorkerVectorEnv(_fails_in_children, 2, 2)


def _fails_in_children():
    if os.environ.get("EASYRL_TEST_PARENT") != str(os.getpid()):
        raise RuntimeError("no env in this process")
    return gymnasium.make("CartPole-v1")
