"""Tests of easyrl.algorithms.linucb and the built-in bandit env: the UCB choice and the A/b
update against hand-computed numbers (the update through a real memory shard, learner and PS
shard), the regret on a short run, and `easyrl train configs/bandit_linucb.yaml` end to end."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from easyrl import config as config_lib
from easyrl.algorithms import registry
from easyrl.algorithms.linucb import Params, build, optimizer, replay_spec
from easyrl.algorithms.linucb.agent import regret_run
from easyrl.envs import env_spaces, make_vector_env
from easyrl.envs.bandit import ENV_ID, LinearBandit, vector_regrets
from easyrl.errors import ConfigError, EasyRLError
from easyrl.roles.common import ShardedWeights, StopSignal
from easyrl.roles.learner import Learner

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "bandit_linucb.yaml"
CONTEXT_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ARMS = gym.spaces.Discrete(3)

# Arm statistics with inverses easy to take by hand: theta_0 = (1, 1), theta_1 = (0.5, -1),
# theta_2 = (0, 0); A_0^-1 = diag(1/2, 1/4), A_1^-1 = I, A_2^-1 = diag(1/4, 1).
A = [[[2, 0], [0, 4]], [[1, 0], [0, 1]], [[4, 0], [0, 1]]]
B = [[2, 4], [0.5, -1], [0, 0]]


def agent_with(a, b, **params):
    agent = build(Params(**params), CONTEXT_SPACE, ARMS, model=None)
    agent.variables["linucb/A"].assign(np.array(a, np.float32))
    agent.variables["linucb/b"].assign(np.array(b, np.float32))
    return agent


def test_ucb_choice_matches_hand_computation():
    agent = agent_with(A, B, alpha=3.0)
    contexts = np.array([[1, 0], [0, 1], [0, -1], [2, 0]], np.float32)
    # means theta_k . x and widths sqrt(x^T A_k^-1 x), by hand.
    means = [[1, 0.5, 0], [1, -1, 0], [-1, 1, 0], [2, 1, 0]]
    widths = [[0.5**0.5, 1, 0.5], [0.5, 1, 1], [0.5, 1, 1], [2 * 0.5**0.5, 2, 1]]
    got_means, got_widths = agent.scores(contexts)
    np.testing.assert_allclose(got_means, means, atol=1e-12)
    np.testing.assert_allclose(got_widths, widths, atol=1e-12)
    # ucb = mean + 3 * width: [3.12, 3.5, 1.5], [2.5, 2, 3], [0.5, 4, 3], [6.24, 7, 3].
    collector = agent.collector(num_envs=4)
    np.testing.assert_array_equal(collector.act(contexts, None), [1, 2, 1, 1])
    assert collector.stats()["ucb_width"] == pytest.approx((1 + 1 + 1 + 2) / 4)
    # Without the bonus (and for evaluation): argmax of the means.
    np.testing.assert_array_equal(agent.greedy(contexts), [0, 0, 1, 0])
    np.testing.assert_array_equal(agent_with(A, B, alpha=0.0).act(contexts)[0], [0, 0, 1, 0])
    # Before any data every arm ties (theta = 0, A = ridge * I): the lowest arm wins.
    fresh = build(Params(), CONTEXT_SPACE, ARMS, model=None)
    np.testing.assert_array_equal(fresh.collector(1).act(contexts[:1], None), [0])


def test_collector_logs_one_item_per_env_step():
    agent = agent_with(A, B, alpha=3.0)
    collector = agent.collector(num_envs=2)
    with pytest.raises(EasyRLError, match="before act"):
        collector.observe(np.zeros(2), None, None, None, None)
    contexts = np.array([[1, 0], [0, 1]], np.float32)
    arms = collector.act(contexts, None)
    items = collector.observe(np.array([0.5, -1.0]), contexts, contexts, [False] * 2, [True] * 2)
    assert set(items) == set(replay_spec(Params(), CONTEXT_SPACE, ARMS))
    np.testing.assert_array_equal(items["context"], contexts)
    np.testing.assert_array_equal(items["arm"], arms)
    np.testing.assert_array_equal(items["reward"], np.array([0.5, -1.0], np.float32))


# A known sequence of logged steps (context, arm, reward), two learner batches of three.
STEPS = [
    ([1, 2], 0, 1.0),
    ([0, 1], 2, -2.0),
    ([3, 0], 0, 0.5),
    ([1, 1], 0, 2.0),
    ([2, -1], 2, 1.0),
    ([1, 0], 0, -1.0),
]
# By hand, with ridge 2: A_k = 2 I + sum x x^T and b_k = sum r x over the steps of arm k.
#   arm 0: x x^T of (1,2), (3,0), (1,1), (1,0) = [[1,2],[2,4]] + [[9,0],[0,0]] + [[1,1],[1,1]]
#          + [[1,0],[0,0]] = [[12,3],[3,5]];  b = (1,2) + 0.5 (3,0) + 2 (1,1) - (1,0) = (3.5, 4)
#   arm 1: never pulled: 2 I and 0
#   arm 2: [[0,0],[0,1]] + [[4,-2],[-2,1]] = [[4,-2],[-2,2]];  b = -2 (0,1) + (2,-1) = (2, -3)
EXPECTED_A = [[[14, 3], [3, 7]], [[2, 0], [0, 2]], [[6, -2], [-2, 4]]]
EXPECTED_B = [[3.5, 4], [0, 0], [2, -3]]


def test_learn_returns_the_negated_increments():
    agent = build(Params(ridge=2.0), CONTEXT_SPACE, ARMS, model=None)
    batch = {
        "context": np.array([s[0] for s in STEPS], np.float32),
        "arm": np.array([s[1] for s in STEPS], np.int64),
        "reward": np.array([s[2] for s in STEPS], np.float32),
    }
    (d_a, d_b), stats, priorities = agent.learn(batch)
    np.testing.assert_array_equal(-d_a, np.array(EXPECTED_A) - 2 * np.eye(2))
    np.testing.assert_array_equal(-d_b, EXPECTED_B)
    assert stats["reward_mean"] == pytest.approx(0.25) and priorities is None
    # The variables are left alone: the PS applies the increments.
    np.testing.assert_array_equal(agent.variables["linucb/A"].numpy(), [2 * np.eye(2)] * 3)
    for bad, match in [
        ({k: v for k, v in batch.items() if k != "reward"}, "lacks columns"),
        ({**batch, "arm": batch["arm"][:2]}, "must be"),
        ({**batch, "arm": batch["arm"] + 1}, "outside"),
    ]:
        with pytest.raises(EasyRLError, match=match):
            agent.learn(bad)


def test_update_through_memory_learner_and_ps_matches_hand_computation(role_servers):
    """The runtime's update path: items inserted in a real memory shard (gRPC), the real
    `Learner` sampling them and applying the increments (the run's only learner), a real PS
    shard receiving every update's result (`publish_every` 1) and counting them."""
    cfg = config_lib.load(
        CONFIG,
        [
            "learner.publish_every=1",
            "algorithm.ridge=2",
            "algorithm.batch_size=3",
            "replay.capacity=6",
            "env.num_envs=1",
            "env.kwargs={num_arms: 3, dim: 2}",
        ],
    )
    shards = role_servers.start(cfg, token="linucb-test-token")
    ctx = shards.ctx
    stop = StopSignal()
    learner = Learner(ctx, ctx.build_algorithm(learner=True), stop)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        memory = ctx.client("memory", 0)
        for start in (0, 3):  # as two actors' shipments
            part = STEPS[start : start + 3]
            batch = {
                "context": np.array([s[0] for s in part], np.float32),
                "arm": np.array([s[1] for s in part], np.int64),
                "reward": np.array([s[2] for s in part], np.float32),
            }
            memory.insert(batch)
        deadline = time.monotonic() + 30
        while shards.ps.counters["applied"] < 2:
            assert time.monotonic() < deadline, f"PS counters: {shards.ps.counters}"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert shards.ps.counters["applied"] == 2 and shards.ps.counters["dropped_stale"] == 0
    values = ctx.client("ps", 0).pull().values
    assert values is not None
    np.testing.assert_array_equal(values["linucb/A"], EXPECTED_A)
    np.testing.assert_array_equal(values["linucb/b"], EXPECTED_B)

    # An actor pulling these values estimates theta_k = A_k^-1 b_k:
    #   theta_0 = [[7, -3], [-3, 14]] / 89 (3.5, 4) = (12.5, 45.5) / 89
    #   theta_1 = 0,  theta_2 = [[4, 2], [2, 6]] / 20 (2, -3) = (0.1, -0.7)
    actor_agent = ctx.build_algorithm()
    weights = ShardedWeights(ctx.clients("ps"), actor_agent.variables)
    assert weights.wait_initialized(StopSignal())
    means, _ = actor_agent.scores(np.array([[1, 0], [0, 1], [-1, 0]], np.float32))
    theta = np.array([[12.5 / 89, 45.5 / 89], [0, 0], [0.1, -0.7]])
    np.testing.assert_allclose(means, [theta[:, 0], theta[:, 1], -theta[:, 0]], atol=1e-12)
    np.testing.assert_array_equal(actor_agent.greedy(np.array([[-1, 0]], np.float32)), [1])


def test_regret_grows_sublinearly_on_a_short_run():
    regret, reward = regret_run(Params(), ENV_ID, steps=2000, num_envs=4, seed=0)
    assert regret.shape == reward.shape == (2000,) and np.all(regret >= 0)
    quarters = regret.reshape(4, 500).sum(axis=1)
    assert quarters[3] < quarters[0] / 4, quarters
    # A uniformly random arm, for scale: its regret does not shrink.
    env = make_vector_env(ENV_ID, 4, seed=0)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    random_regret = np.concatenate(
        [vector_regrets(env.step(rng.integers(5, size=4))[4], 4) for _ in range(125)]
    )
    env.close()
    assert quarters[3] < random_regret.sum() / 10


def test_bandit_env_reports_regret_and_is_seeded():
    env = LinearBandit(num_arms=3, dim=4, noise_std=0.0, problem_seed=7)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4,) and obs.dtype == np.float32
    assert np.linalg.norm(obs) == pytest.approx(1.0, abs=1e-6)
    means = env.theta @ obs.astype(np.float64)
    best, worst = int(np.argmax(means)), int(np.argmin(means))
    _, reward, terminated, truncated, info = env.step(best)
    assert info["regret"] == 0.0 and reward == pytest.approx(means[best])
    assert not terminated and not truncated
    obs2 = env._context.copy()
    _, _, _, _, info = env.step(worst)
    means2 = env.theta @ obs2
    assert info["regret"] == pytest.approx(means2.max() - means2[worst])
    # Same problem_seed: same arms; env seed: same contexts.
    again = LinearBandit(num_arms=3, dim=4, noise_std=0.0, problem_seed=7)
    np.testing.assert_array_equal(again.theta, env.theta)
    np.testing.assert_array_equal(again.reset(seed=1)[0], obs)
    with pytest.raises(ConfigError, match="num_arms"):
        LinearBandit(num_arms=1)
    with pytest.raises(ValueError, match="arm"):
        env.step(3)
    # Registered on import of easyrl.envs; blocks of 100 pulls end by truncation.
    obs_space, action_space = env_spaces(ENV_ID)
    assert obs_space.shape == (8,) and action_space.n == 5
    vec = make_vector_env(ENV_ID, 2, seed=0)
    vec.reset(seed=0)
    for t in range(100):
        _, _, terminated, truncated, infos = vec.step(np.array([0, 1]))
        assert not terminated.any() and truncated.all() == (t == 99)
    assert vector_regrets(infos, 2).shape == (2,)  # from infos["final_info"]
    vec.close()
    with pytest.raises(EasyRLError, match="regret"):
        vector_regrets({}, 2)


def test_params_spaces_and_registry():
    assert registry.spec("linucb").flow == "async_replay"
    for change in ({"alpha": -1.0}, {"alpha": float("nan")}, {"ridge": 0.0}, {"batch_size": 0}):
        with pytest.raises(ConfigError, match=next(iter(change))):
            Params(**change)
    spec = optimizer(Params())
    assert (spec.kind, spec.lr, spec.decay_rate) == ("sgd", 1.0, 1.0)
    assert Params.max_staleness >= 2**62  # increments are never stale
    with pytest.raises(ConfigError, match="Discrete"):
        build(Params(), CONTEXT_SPACE, gym.spaces.Box(-1, 1, (2,)), model=None)
    with pytest.raises(ConfigError, match="flat Box"):
        build(Params(), gym.spaces.Box(0, 1, (2, 2)), ARMS, model=None)
    cfg = config_lib.load(CONFIG)
    assert cfg.replay.kind == "trajectory" and cfg.algorithm.name == "linucb"
    with pytest.raises(ConfigError, match="replay.kind"):
        config_lib.load(CONFIG, ["replay.kind=uniform"])


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_train_bandit_config_reaches_its_target(tmp_path):
    """`easyrl train configs/bandit_linucb.yaml` (one actor to keep it light) exits 0 on its
    target, and every logged step the PS applied added exactly one unit context to A."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "easyrl.cli", "train", str(CONFIG)]
    command += ["--set", f"run.dir={run_dir}", "--set", "cluster.actor=1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=140)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary["reason"].startswith("target reached"), summary["reason"]
    with np.load(run_dir / "checkpoints" / "ps-0.npz") as ckpt:
        a = ckpt["var/linucb/A"]
        meta = json.loads(ckpt["meta"].tobytes())
    assert meta["counters"]["dropped_stale"] == 0
    # Contexts are unit vectors: trace(x x^T) = 1, so trace(A) - ridge * K * d counts them.
    logged = np.trace(a, axis1=1, axis2=2).sum() - 1.0 * 5 * 8
    assert logged == pytest.approx(32 * meta["counters"]["applied"], abs=0.5)
    assert meta["counters"]["applied"] > 0
