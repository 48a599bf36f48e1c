"""Offline data: recording (actor side), the dataset format, memory shards loading their
share, MARWIL/BC losses, off-policy evaluation, config errors, and a real recording run
followed by a real BC run on what it wrote."""

import math
from pathlib import Path

import numpy as np
import pytest
from test_cluster import Run, _assert_no_processes_left

from easyrl import config as config_lib
from easyrl.algorithms import marwil, registry
from easyrl.cluster.spec import ClusterSpec
from easyrl.envs import env_spaces, final_observations, make_vector_env
from easyrl.errors import ConfigError, ReplayError
from easyrl.offline.dataset import (
    EPISODE_STRIDE,
    RECORD_COMMAND,
    check_output_dir,
    list_shards,
    load_schema,
    read_steps,
)
from easyrl.offline.ope import (
    LoggedEpisode,
    OffPolicyEvaluator,
    importance_sampling,
    weighted_importance_sampling,
)
from easyrl.offline.recorder import Recorder
from easyrl.roles import memory as memory_role
from easyrl.transport import easyrl_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
NUM_ENVS = 4


def _record(directory: Path, vector_steps: int, actor: int = 0, max_file_mb: float = 0.01):
    """Steps CartPole with a real PPO collector for `vector_steps` steps, recording with a
    Recorder; returns the episodes the loop finished, as the test saw them (in finishing
    order: step, then env index), and the Recorder."""
    cfg = config_lib.from_dict(
        {
            "algorithm": {"name": "ppo", "rollout_length": vector_steps + 1},
            "env": {"num_envs": NUM_ENVS},
            "output": {"dir": str(directory), "max_file_mb": max_file_mb},
        }
    )
    obs_space, action_space = env_spaces("CartPole-v1")
    module = registry.module("ppo")
    algo = module.build(cfg.algorithm.params, obs_space, action_space, cfg.model, seed=actor)
    collector = algo.collector(NUM_ENVS, seed=actor)
    recorder = Recorder(cfg, actor, 1, directory.parent, obs_space, action_space)
    env = make_vector_env("CartPole-v1", NUM_ENVS, seed=actor)
    obs, _ = env.reset(seed=actor)
    rng = np.random.default_rng(actor)
    open_rows = [[] for _ in range(NUM_ENVS)]
    finished = []
    for _ in range(vector_steps):
        actions = collector.act(obs, rng)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        real_next = final_observations(next_obs, infos, terminated | truncated)
        logp = collector.last_action_logp
        recorder.step(obs, actions, rewards, terminated, truncated, real_next, logp)
        collector.observe(rewards, next_obs, real_next, terminated, truncated)
        for i in range(NUM_ENVS):
            row = (obs[i], actions[i], rewards[i], terminated[i], truncated[i], real_next[i])
            open_rows[i].append((*row, logp[i]))
            if terminated[i] or truncated[i]:
                finished.append(open_rows[i])
                open_rows[i] = []
        obs = next_obs
    env.close()
    recorder.close()
    return finished, recorder


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A dataset recorded by one actor (small shards), its episodes as seen by the test."""
    directory = tmp_path_factory.mktemp("offline") / "data"
    finished, recorder = _record(directory, 300)
    return directory, finished, recorder


def test_round_trip_keeps_every_field_and_dtype(recorded):
    directory, finished, recorder = recorded
    steps = read_steps(directory)
    schema = load_schema(directory)
    assert schema["env_id"] == "CartPole-v1"
    assert schema["action_space"] == {"type": "Discrete", "n": 2}
    columns = ["obs", "action", "reward", "terminated", "truncated", "next_obs"]
    columns += ["episode", "t", "action_logp"]
    assert sorted(steps) == sorted(columns) == sorted(schema["columns"])
    dtypes = {k: np.dtype(c["dtype"]) for k, c in schema["columns"].items()}
    assert dtypes["obs"] == np.float32 and dtypes["action"] == np.int64
    assert dtypes["reward"] == np.float32 and dtypes["terminated"] == np.bool_
    assert dtypes["episode"] == np.int64 and dtypes["t"] == np.int32
    assert all(steps[k].dtype == dtypes[k] for k in steps)
    # Every episode the loop finished, in finishing order, nothing else; open ones dropped.
    assert len(finished) > 10
    assert len(steps["t"]) == sum(len(e) for e in finished)
    assert recorder.writer.counters["dropped_open_steps"] > 0
    start = 0
    for j, episode in enumerate(finished):
        rows = slice(start, start + len(episode))
        start += len(episode)
        assert np.all(steps["episode"][rows] == j)  # actor 0: ids 0, 1, 2, ...
        np.testing.assert_array_equal(steps["t"][rows], np.arange(len(episode)))
        for k, name in enumerate(["obs", "action", "reward", "terminated", "truncated"]):
            np.testing.assert_array_equal(steps[name][rows], np.array([r[k] for r in episode]))
        np.testing.assert_array_equal(steps["next_obs"][rows], np.array([r[5] for r in episode]))
        np.testing.assert_array_equal(
            steps["action_logp"][rows], np.array([r[6] for r in episode], np.float32)
        )
        ends = steps["terminated"][rows] | steps["truncated"][rows]
        assert ends[-1] and not ends[:-1].any()
    # PPO's behaviour log-probabilities of two actions: log p in (log 1e-3, 0).
    assert np.all(steps["action_logp"] < 0) and np.all(steps["action_logp"] > math.log(1e-3))


def test_shards_roll_over_at_the_size_limit_and_hold_whole_episodes(recorded):
    directory, _, _ = recorded
    shards = list_shards(directory)
    assert len(shards) >= 3
    seen = set()
    for shard in shards:
        assert shard.stat().st_size <= 0.01 * 2**20
        with np.load(shard) as data:
            episodes = set(data["episode"].tolist())
            ends = data["terminated"] | data["truncated"]
            assert ends.sum() == len(episodes)  # whole episodes only
        assert not episodes & seen  # no episode in two shards
        seen |= episodes
    assert seen == set(read_steps(directory)["episode"].tolist())


def test_a_restarted_actor_continues_after_its_newest_shard(tmp_path):
    directory = tmp_path / "data"
    _record(directory, 60, actor=1)
    before = list_shards(directory)
    ids_before = set(read_steps(directory)["episode"].tolist())
    _record(directory, 60, actor=1)
    after = list_shards(directory)
    assert set(before) < set(after)
    ids = read_steps(directory)["episode"]
    assert set(ids_before) < set(ids.tolist())
    assert np.all(ids // EPISODE_STRIDE == 1)
    with pytest.raises(ConfigError, match="already holds a dataset"):
        check_output_dir(directory)


def _offline_cfg(directory: Path, *overrides: str, algorithm: str = "bc"):
    raw = {
        "algorithm": {"name": algorithm},
        "env": {"id": "CartPole-v1"},
        "input": {"dir": str(directory)},
        "replay": {"min_size_to_sample": 10},
    }
    return config_lib.from_dict(raw, overrides)


def test_memory_shards_load_disjoint_shares_whose_union_is_the_dataset(recorded):
    directory, _, _ = recorded
    cfg = _offline_cfg(directory, "cluster.memory=3")
    assert cfg.cluster.actor is None  # no actors in an offline run
    obs_space, action_space = env_spaces("CartPole-v1")
    spec = marwil.replay_spec(cfg.algorithm.params, obs_space, action_space)
    cluster = ClusterSpec(
        ps=("127.0.0.1:1",), memory=tuple(f"127.0.0.1:{p}" for p in (2, 3, 4)), learner=1, actor=0
    )
    shards = [memory_role.build(cfg, spec, i, cluster) for i in range(3)]
    try:
        loaded = [dict(m.counters) for m in shards]
        tables = [m.table.state_dict() for m in shards]
        batch = shards[0].Sample(pb.SampleRequest(batch_size=8, timeout_s=5), None)
    finally:
        for m in shards:
            m.close()
    assert batch.ready  # no insert is awaited: the loaded items are served
    assert sum(c["loaded_shards"] for c in loaded) == len(list_shards(directory))
    assert all(c["loaded_items"] > 0 for c in loaded)
    everything = marwil.dataset_items(cfg.algorithm.params, read_steps(directory))
    assert sum(c["loaded_items"] for c in loaded) == len(everything["return"])

    def rows(items):  # one row per item: obs, action, return; sorted
        table = np.column_stack([items["obs"], items["action"], items["return"]])
        return table[np.lexsort(table.T[::-1])]

    union = {k: np.concatenate([t[f"data/{k}"] for t in tables]) for k in everything}
    np.testing.assert_array_equal(rows(union), rows(everything))


def test_memory_shard_refuses_a_share_larger_than_its_capacity(recorded):
    directory, _, _ = recorded
    cfg = _offline_cfg(directory, "replay.capacity=50")
    obs_space, action_space = env_spaces("CartPole-v1")
    spec = marwil.replay_spec(cfg.algorithm.params, obs_space, action_space)
    with pytest.raises(ReplayError, match="replay.capacity 50 is too small"):
        memory_role.build(cfg, spec, 0)


def test_returns_to_go_per_episode():
    rewards = np.array([1.0, 1.0, 1.0, 2.0, 2.0], np.float32)
    steps = {"episode": np.array([7, 7, 7, 9, 9]), "t": np.array([0, 1, 2, 0, 1], np.int32)}
    steps.update(reward=rewards, obs=np.zeros((5, 4), np.float32), action=np.zeros(5, np.int64))
    items = marwil.dataset_items(marwil.Params(gamma=0.5), steps)
    np.testing.assert_allclose(items["return"], [1.75, 1.5, 1.0, 3.0, 2.0])
    assert items["return"].dtype == np.float32


def _agents(name_beta_pairs, action_space):
    from easyrl.algorithms import bc

    obs_space = env_spaces("CartPole-v1")[0]
    model = config_lib.ModelConfig()
    out = []
    for name, beta in name_beta_pairs:
        module = bc if name == "bc" else marwil
        params = module.Params() if name == "bc" else marwil.Params(beta=beta)
        out.append(module.build(params, obs_space, action_space, model, seed=3))
    return out


def test_marwil_with_beta_zero_is_bc():
    import gymnasium as gym

    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.normal(size=(32, 4)).astype(np.float32),
        "action": rng.integers(2, size=32),
        "return": rng.normal(size=32).astype(np.float32) * 10,
    }
    bc, zero, one = _agents([("bc", 0.0), ("marwil", 0.0), ("marwil", 1.0)], gym.spaces.Discrete(2))
    logits = bc.pi(batch["obs"]).numpy().astype(np.float64)
    log_softmax = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
    nll = -np.mean(log_softmax[np.arange(32), batch["action"]])
    assert bc.loss(batch)["loss"] == pytest.approx(nll, rel=1e-5)
    assert zero.loss(batch) == bc.loss(batch)
    assert sorted(zero.variables) == sorted(bc.variables)  # no value head for beta = 0
    weighted = one.loss(batch)
    assert weighted["policy_loss"] != pytest.approx(nll, rel=1e-3)
    assert weighted["value_loss"] > 0 and weighted["loss"] != bc.loss(batch)["loss"]
    # The first learn step's loss is the loss before it; BC's gradients move only pi/.
    grads, stats, priorities = bc.learn(batch)
    assert stats["loss"] == pytest.approx(nll, rel=1e-5) and priorities is None
    assert len(grads) == len(bc.variables) and any(np.any(g != 0) for g in grads)


def test_bc_on_continuous_actions_is_the_gaussian_nll():
    import gymnasium as gym

    space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    rng = np.random.default_rng(1)
    batch = {
        "obs": rng.normal(size=(16, 4)).astype(np.float32),
        "action": rng.uniform(-2, 2, size=(16, 2)).astype(np.float32),
        "return": np.zeros(16, np.float32),
    }
    (bc,) = _agents([("bc", 0.0)], space)
    mean = bc.pi(batch["obs"]).numpy().astype(np.float64)
    # log_std = 0: log N(a; mu, 1) summed over the 2 dimensions.
    logp = -0.5 * np.sum((batch["action"] - mean) ** 2 + math.log(2 * math.pi), axis=1)
    assert bc.loss(batch)["loss"] == pytest.approx(-np.mean(logp), rel=1e-5)
    np.testing.assert_allclose(bc.action_logp(batch["obs"], batch["action"]), logp, rtol=1e-5)
    assert np.all(np.abs(bc.greedy(batch["obs"])) <= 2.0)


def test_importance_sampling_against_a_hand_computed_example():
    # Episode A: 2 steps, reward 1 each; pi/mu = 0.8/0.5 then 0.6/0.5 -> w = 1.92,
    # G = 1 + 0.9 * 1 = 1.9. Episode B: 1 step, reward 2; pi/mu = 0.5/0.25 -> w = 2, G = 2.
    a = LoggedEpisode(np.array([1.0, 1.0]), np.log([0.5, 0.5]), np.log([0.8, 0.6]))
    b = LoggedEpisode(np.array([2.0]), np.log([0.25]), np.log([0.5]))
    assert importance_sampling([a, b], gamma=0.9) == pytest.approx((1.92 * 1.9 + 2 * 2) / 2)
    wis = (1.92 * 1.9 + 2 * 2) / (1.92 + 2)
    assert weighted_importance_sampling([a, b], gamma=0.9) == pytest.approx(wis)
    # Same numbers through the evaluator's path: rows of a dataset and a target policy.
    steps = {
        "episode": np.array([0, 0, 1]),
        "t": np.array([0, 1, 0], np.int32),
        "reward": np.array([1.0, 1.0, 2.0], np.float32),
        "action_logp": np.log([0.5, 0.5, 0.25]).astype(np.float32),
        "obs": np.array([[0.8], [0.6], [0.5]], np.float32),
        "action": np.zeros(3, np.int64),
    }
    ope = OffPolicyEvaluator(steps, episodes=10, gamma=0.9)
    estimates = ope.estimate(lambda obs, actions: np.log(obs[:, 0]))
    assert estimates["eval_ope_is"] == pytest.approx((1.92 * 1.9 + 4) / 2, rel=1e-6)
    assert estimates["eval_ope_wis"] == pytest.approx(wis, rel=1e-6)
    assert estimates["eval_ope_episodes"] == 2
    # A target that never takes a logged action: IS 0, WIS falls back to the mean return.
    never = [e._replace(target_logp=np.full(len(e.rewards), -np.inf)) for e in (a, b)]
    assert importance_sampling(never, gamma=0.9) == 0.0
    assert weighted_importance_sampling(never, gamma=0.9) == pytest.approx((1.9 + 2) / 2)


def test_config_errors_name_the_problem(recorded, tmp_path):
    directory, _, _ = recorded
    with pytest.raises(ConfigError, match="does not exist.*" + RECORD_COMMAND.replace(".", r"\.")):
        config_lib.load(ROOT / "configs" / "cartpole_bc.yaml", [f"input.dir={tmp_path / 'no'}"])
    with pytest.raises(ConfigError, match="recorded with env id 'CartPole-v1'"):
        _offline_cfg(directory, "env.id=Acrobot-v1")
    with pytest.raises(ConfigError, match="ppo cannot train from a dataset"):
        _offline_cfg(directory, algorithm="ppo")
    with pytest.raises(ConfigError, match="bc trains from a recorded dataset only"):
        config_lib.from_dict({"algorithm": {"name": "bc"}})
    with pytest.raises(ConfigError, match="cluster.actor: an offline run"):
        _offline_cfg(directory, "cluster.actor=2")
    with pytest.raises(ConfigError, match="stop.max_env_steps: an offline run"):
        _offline_cfg(directory, "stop.max_env_steps=100")
    with pytest.raises(ConfigError, match="bc: beta is fixed at 0"):
        _offline_cfg(directory, "algorithm.beta=1")
    with pytest.raises(ConfigError, match="output: max_steps and min_return_mean need dir"):
        config_lib.from_dict({"algorithm": {"name": "ppo"}, "output": {"max_steps": 10}})


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_record_then_train_bc_with_no_actors(tmp_path):
    """A real recording run (PPO, 1 actor) stops itself after 1,500 recorded steps; a real
    BC run on that dataset, with no actor, trains and evaluates (returns and OPE)."""
    data = tmp_path / "data"
    (tmp_path / "record").mkdir()
    record = Run(
        tmp_path / "record",
        ["cluster.actor=1", "env.num_envs=4", "algorithm.num_epochs=2", "stop.max_seconds=120"],
        config=ROOT / "configs" / "cartpole_record.yaml",
        base=(f"output.dir={data}", "output.min_return_mean=null", "output.max_steps=1500"),
    )
    try:
        code = record.wait(150)
        assert code == 0, f"{record.output()}\n{record.logs()}"
        assert "output.max_steps reached" in record.summary()["reason"]
    finally:
        record.cleanup()
    _assert_no_processes_left(record.run_dir)
    steps = read_steps(data)
    assert len(steps["t"]) >= 1500 and "action_logp" in steps

    (tmp_path / "bc").mkdir()
    bc = Run(
        tmp_path / "bc",
        # A backstop: the run is interrupted once it trained and evaluated (a budget stop
        # of an offline run, exit 0, is test_bcq's).
        ["stop.max_seconds=200", "eval.interval_s=0", "eval.episodes=2", "eval.num_envs=2"],
        config=ROOT / "configs" / "cartpole_bc.yaml",
        base=(f"input.dir={data}", "stop.eval_return_mean=null", "run.log_interval_s=0.5"),
    )

    def trained_and_evaluated():
        last = (bc.metrics() or [{}])[-1]
        return last.get("updates", 0) > 0 and "evaluator/eval_ope_wis" in last

    try:
        bc.poll_until(trained_and_evaluated, 120, "updates, an evaluation and its OPE")
        summary = bc.interrupt()
    finally:
        bc.cleanup()
    assert set(summary["restarts"]) == {"ps-0", "memory-0", "learner-0", "evaluator-0"}
    memory = summary["servers"]["memory/0"]["counters"]
    assert memory["memory/0/loaded_items"] == len(steps["t"])
    assert memory["memory/0/samples"] > 0
    last = bc.metrics()[-1]
    assert last["updates"] > 0 and last["env_steps"] == 0
    assert "eval_return_mean" in last
    assert np.isfinite(last["evaluator/eval_ope_wis"]) and "evaluator/eval_ope_is" in last
