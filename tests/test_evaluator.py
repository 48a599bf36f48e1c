"""The evaluator's pieces: whole episodes on a vector env, the best checkpoint, and the
evaluation statistics and stop condition on PS shard 0."""

import json
import threading

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from easyrl.config import OutputConfig, StopConfig
from easyrl.envs import make_vector_env
from easyrl.envs.evaluation import Stateless, play_episodes
from easyrl.metrics import RunStats, Stop, StopKind, reached_goal, stop_reason
from easyrl.roles.evaluator import BestCheckpoint


def run_episodes(env, policy, episodes, seed, stop):
    """The evaluator's use of `play_episodes` with a stateless `policy`: the returns only."""
    return play_episodes(env, Stateless(policy), episodes, seed, stop)[0]


def test_run_episodes_counts_exactly_the_asked_whole_episodes():
    env = make_vector_env("CartPole-v1", 3, seed=0, max_episode_steps=25)
    try:
        always_left = lambda obs: np.zeros(len(obs), np.int64)  # noqa: E731
        returns = run_episodes(env, always_left, 7, seed=5, stop=threading.Event())
    finally:
        env.close()
    # The same episodes played one by one: env i of the vector is seeded 5 + i and later
    # episodes continue its own random stream, so compare the multiset of lengths by
    # playing every env's episodes in order.
    expected = []
    for i in range(3):
        single = gym.make("CartPole-v1", max_episode_steps=25)
        single.reset(seed=5 + i)
        episode, total = 0.0, []
        while len(total) < 3:
            _, r, term, trunc, _ = single.step(0)
            episode += r
            if term or trunc:
                total.append(episode)
                episode = 0.0
                single.reset()
        expected.append(total)
        single.close()
    assert len(returns) == 7
    assert all(1 <= r <= 25 for r in returns)
    # Envs 0..2 start episodes 1..3, then the next four starts go to whichever ends first.
    pool = sorted(x for per_env in expected for x in per_env)
    assert all(r in pool for r in returns)


def test_run_episodes_with_fewer_episodes_than_envs():
    env = make_vector_env("CartPole-v1", 4, seed=0, max_episode_steps=10)
    try:
        returns = run_episodes(
            env, lambda obs: np.ones(len(obs), np.int64), 2, seed=0, stop=threading.Event()
        )
    finally:
        env.close()
    assert len(returns) == 2


def test_best_checkpoint_keeps_only_improvements(tmp_path):
    path = tmp_path / "checkpoints" / "best.npz"
    variables = {"pi/w": tf.Variable(np.ones((2, 2), np.float32))}
    best = BestCheckpoint(path)
    assert best.offer(-300.0, variables, {"versions": [3]})
    variables["pi/w"].assign(np.full((2, 2), 7.0, np.float32))
    assert not best.offer(-400.0, variables, {"versions": [4]})
    with np.load(path) as data:
        assert np.all(data["var/pi/w"] == 1.0)
        assert json.loads(data["meta"].tobytes()) == {"versions": [3], "eval_return_mean": -300}
    again = BestCheckpoint(path)  # a restarted evaluator only replaces it with better
    assert again.best == -300.0
    assert again.offer(-150.0, variables, {"versions": [9]})
    with np.load(path) as data:
        assert np.all(data["var/pi/w"] == 7.0)


def test_evaluation_returns_reach_the_snapshot_and_can_stop_the_run():
    stats = RunStats(window=3)
    stats.report("actor", 0, 100, 0, [1.0, 2.0], [5, 6], {})
    stats.report("evaluator", 0, 0, 0, [], [], {}, evals=[-250.0, -150.0])
    snap = stats.snapshot()
    assert snap["eval_return_mean"] == -200.0 and snap["eval_episodes"] == 2
    assert snap["eval_at_env_steps"] == 100 and snap["eval_count"] == 1
    assert snap["episodes"] == 2  # evaluation episodes are not training episodes
    stats.report("evaluator", 0, 0, 0, [], [], {}, evals=[-400.0])
    snap = stats.snapshot()
    assert snap["eval_return_mean"] == -400.0 and snap["eval_return_best"] == -200.0
    stop = StopConfig(eval_return_mean=-300.0)
    assert stop_reason(stop, snap, 10.0) is None
    stats.report("evaluator", 0, 0, 0, [], [], {}, evals=[-190.0])
    reason = stop_reason(stop, stats.snapshot(), 11.0)
    text = "target reached: evaluation return -190.0 >= -300 (1 episodes)"
    assert reason == Stop(StopKind.EVAL_TARGET, text)
    assert reached_goal(stop, reason.kind)
    restored = RunStats(window=3)
    restored.load_state(stats.state())
    assert restored.snapshot()["eval_return_best"] == -190.0


@pytest.mark.parametrize("cluster", [{}, {"evaluator": 0}])
def test_eval_stop_needs_an_evaluator(cluster):
    from easyrl.config import from_dict
    from easyrl.errors import ConfigError

    raw = {"algorithm": {"name": "dqn"}, "stop": {"eval_return_mean": 1.0}, "cluster": cluster}
    with pytest.raises(ConfigError, match="needs an evaluator"):
        from_dict(raw)


def test_recording_run_stops_and_succeeds_once_all_steps_are_written():
    output = OutputConfig(dir="/tmp/data", max_steps=100)
    stop = StopConfig(max_seconds=60.0)
    written = {"actor/0/recorded_steps": 60.0, "actor/1/recorded_steps": 30.0}
    assert stop_reason(stop, written, 10.0, output) is None
    assert stop_reason(stop, written, 61.0, output) == (
        StopKind.MAX_SECONDS,
        "max_seconds reached: 61 s",
    )
    assert not reached_goal(stop, StopKind.MAX_SECONDS, output)  # the budget ran out
    written["actor/1/recorded_steps"] = 40.0
    reason = stop_reason(stop, written, 61.0, output)
    assert reason == (StopKind.OUTPUT_MAX_STEPS, "output.max_steps reached: 100 steps recorded")
    assert reached_goal(stop, reason.kind, output)
    assert stop_reason(stop, written, 10.0) is None  # not a recording run


@pytest.mark.parametrize(
    ("stop", "output", "succeeds"),
    [
        # No return target, no recording: a budget stop is the goal; no stop condition
        # (a crash, a child that gave up, Ctrl-C) never is, whatever its message says.
        (StopConfig(max_env_steps=10), None, {StopKind.MAX_ENV_STEPS, StopKind.MAX_SECONDS}),
        (StopConfig(episode_return_mean=1.0), None, {StopKind.TARGET, StopKind.EVAL_TARGET}),
        (StopConfig(), OutputConfig(dir="/tmp/d", max_steps=5), {StopKind.OUTPUT_MAX_STEPS}),
    ],
)
def test_success_is_judged_from_the_typed_stop_condition(stop, output, succeeds):
    for kind in [*StopKind, None]:
        assert reached_goal(stop, kind, output) == (kind in succeeds), kind


def test_a_max_env_steps_stop_says_where_it_stopped_and_why_past_the_limit():
    """The PS counts env steps as the actors' reports arrive, so a run stops past
    `stop.max_env_steps`; the reason gives both counts and says why."""
    reason = stop_reason(StopConfig(max_env_steps=10240), {"env_steps": 11264.0}, 5.0)
    assert reason == Stop(
        StopKind.MAX_ENV_STEPS,
        "max_env_steps 10,240 reached at 11,264 (counters arrive in actor reports)",
    )
