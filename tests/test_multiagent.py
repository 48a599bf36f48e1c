"""Multi-agent training: the slots adapter (late and early agents, resets), the config's
`multiagent` section, per-policy variables and learning, per-policy metrics, and one real
cluster run per algorithm (easyrl.envs.multiagent, easyrl.algorithms.multiagent)."""

import dataclasses
import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from test_cluster import ROOT, _assert_no_processes_left, _counters
from test_ps import assign, pull, push

from easyrl import config as config_lib
from easyrl.algorithms import multiagent, registry
from easyrl.envs.multiagent import (
    SlotVectorEnv,
    TwoRunners,
    agent_spaces,
    env_factory,
    run_spaces,
)
from easyrl.errors import ConfigError, EasyRLError
from easyrl.metrics import RunStats, check_policies
from easyrl.roles.actor import EpisodeTracker

ENV_ID = "easyrl/TwoRunners-v0"
MAPPING = {"policies": ["p0", "p1"], "policy_mapping": {"runner_0": "p0", "runner_1": "p1"}}


def oracle(obs: np.ndarray) -> np.ndarray:
    """TwoRunners' best actions for slots `[S, 3]` (runner_1, odd slots, is mirrored)."""
    direction = np.sign(obs[:, 2]).astype(np.int64)  # goal - position
    return np.where(np.arange(len(obs)) % 2 == 0, direction + 1, 1 - direction)


def raw_config(algorithm: dict, **sections) -> dict:
    """A raw multi-agent config on TwoRunners."""
    return {
        "algorithm": algorithm,
        "env": {"id": ENV_ID, "num_envs": 2},
        "multiagent": MAPPING,
        **sections,
    }


# --- the slots adapter -----------------------------------------------------------------------


def test_slots_are_copies_times_agents_and_the_late_agent_starts_absent():
    env = SlotVectorEnv(ENV_ID, 3)
    obs, _ = env.reset(seed=0)
    assert env.agents == ["runner_0", "runner_1"] and env.num_envs == 6
    assert env.present.tolist() == [True, False] * 3
    assert np.all(obs[1::2] == 0) and np.all(np.abs(obs[0::2]).sum(axis=1) > 0)
    for _ in range(2):  # join_step 3: runner_1 still away
        obs, rewards, terminated, truncated, _ = env.step(np.ones(6, np.int64))  # stay
        assert not (terminated | truncated).any() and np.all(rewards[1::2] == 0)
    obs, *_ = env.step(np.ones(6, np.int64))
    assert env.present.all()  # joined after 3 steps
    assert np.all(np.abs(obs[1::2]).sum(axis=1) > 0)


def test_an_agent_at_its_goal_leaves_early_its_slot_ends_and_the_copy_resets_after_both():
    env = SlotVectorEnv(ENV_ID, 1, kwargs={"join_step": 1})
    obs, _ = env.reset(seed=3)
    ended, joined, resets = {0: 0, 1: 0}, False, 0  # joined: runner_1 came in this episode
    for _ in range(60):
        acted = env.present.copy()
        obs, rewards, terminated, truncated, infos = env.step(oracle(obs))
        done = terminated | truncated
        assert not (done & ~acted).any()  # only an agent that acted can leave
        assert np.all(rewards[~acted] == 0)
        for s in np.flatnonzero(done):
            assert terminated[s] and not truncated[s]  # reached its goal
            assert infos["final_obs"][s][2] == 0  # the last observation: at the goal
            ended[s] += 1
        joined |= bool(acted[1])
        still = acted & ~done
        if still.any():  # the episode goes on: whoever did not leave stays
            assert env.present[still].all()
        elif not joined:  # runner_0 left before runner_1's time: runner_1 joins at once
            assert env.present.tolist() == [False, True]
        else:  # both left: a new episode, runner_0 alone, runner_1 absent (zeros)
            assert env.present.tolist() == [True, False] and np.all(obs[1] == 0)
            joined, resets = False, resets + 1
    assert ended[0] >= 3 and ended[1] >= 3 and resets >= 3


def test_max_episode_steps_truncates_every_present_agent_and_resets_the_copy():
    env = SlotVectorEnv(ENV_ID, 2, kwargs={"join_step": 1, "size": 30}, max_episode_steps=2)
    env.reset(seed=0)
    env.step(np.ones(4, np.int64))  # stay: nobody reaches a goal
    _, _, terminated, truncated, infos = env.step(np.ones(4, np.int64))
    assert truncated.all() and not terminated.any()
    assert all(infos["final_obs"][s] is not None for s in range(4))
    assert env.present.tolist() == [True, False, True, False]


def test_episodes_of_slots_count_only_the_steps_their_agents_acted():
    tracker = EpisodeTracker(2, ["p0", "p1"])
    tracker.step(np.array([1.0, 0.0]), np.array([False, False]), np.array([True, False]))
    tracker.step(np.array([1.0, 2.0]), np.array([True, True]), np.array([True, True]))
    assert tracker.take() == ([2.0, 2.0], [2, 1], ["p0", "p1"])
    single = EpisodeTracker(1)
    single.step(np.array([1.0]), np.array([True]))
    assert single.take() == ([1.0], [1], [])


def test_with_agent_id_each_slot_observes_its_agents_one_hot_index():
    plain = SlotVectorEnv(ENV_ID, 2, kwargs={"join_step": 1})
    env = SlotVectorEnv(ENV_ID, 2, kwargs={"join_step": 1}, agent_id=True)
    width = plain.single_observation_space.shape[0]
    space = env.single_observation_space
    assert space.shape == (width + 2,) and space.dtype == plain.single_observation_space.dtype
    assert space.low[width:].tolist() == [0, 0] and space.high[width:].tolist() == [1, 1]
    cfg = config_lib.from_dict(raw_config({"name": "impala"}), ["multiagent.agent_id=true"])
    assert run_spaces(cfg)[0] == space  # what the roles size their networks by
    ids = np.tile(np.eye(2), (2, 1))  # slot e * 2 + j: agent j
    obs, _ = env.reset(seed=5)
    expected, _ = plain.reset(seed=5)
    endings = 0
    for _ in range(40):
        np.testing.assert_array_equal(obs[:, :width], expected)  # the env's own entries
        np.testing.assert_array_equal(obs[:, width:], ids)
        actions = oracle(expected)
        obs, _, terminated, truncated, infos = env.step(actions)
        expected, _, _, _, plain_infos = plain.step(actions)
        ended = np.flatnonzero(terminated | truncated)
        endings += len(ended)
        for s in ended:
            final = infos["final_obs"][s]
            np.testing.assert_array_equal(final, [*plain_infos["final_obs"][s], *ids[s]])
    assert endings >= 4


def test_agent_id_needs_flat_observations():
    with pytest.raises(ConfigError, match="multiagent.agent_id needs flat observations"):
        agent_spaces("test_multiagent:ImageRunners", agent_id=True)
    assert agent_spaces("test_multiagent:ImageRunners")[1].shape == (3, 1)  # fine without


class ImageRunners(TwoRunners):
    """TwoRunners whose observation space is a Box of rank 2."""

    def observation_space(self, agent: str):
        return gym.spaces.Box(-1.0, 1.0, (3, 1), np.float32)


def test_agents_with_different_spaces_are_refused():
    with pytest.raises(ConfigError, match="must share one observation and one action space"):
        agent_spaces("test_multiagent:Mismatched")


class Mismatched(TwoRunners):
    """TwoRunners whose runner_1 has another action space."""

    def action_space(self, agent: str):
        return gym.spaces.Discrete(4 if agent == "runner_1" else 3)


def _pettingzoo_wrapped():
    """TwoRunners through PettingZoo's own conversion wrappers (parallel -> AEC -> parallel)."""
    from pettingzoo.utils import conversions

    return conversions.aec_to_parallel(conversions.parallel_to_aec(TwoRunners()))


def test_two_runners_passes_pettingzoos_parallel_api_test_and_its_wrappers_step_alike():
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import parallel_api_test

    parallel_api_test(TwoRunners(), num_cycles=200)  # asserts; prints when it passes
    ours, wrapped = (
        SlotVectorEnv(ENV_ID, 2),
        SlotVectorEnv("test_multiagent:_pettingzoo_wrapped", 2),
    )
    obs, _ = ours.reset(seed=5)
    other, _ = wrapped.reset(seed=5)
    for _ in range(30):
        np.testing.assert_array_equal(obs, other)
        assert ours.present.tolist() == wrapped.present.tolist()
        action = oracle(obs)
        obs, *a = ours.step(action)
        other, *b = wrapped.step(action)
        for x, y in zip(a[:3], b[:3], strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_pettingzoo_id_without_pettingzoo_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pettingzoo" else real(name)
    )
    with pytest.raises(ConfigError, match=r"easyrl\[multiagent\]"):
        env_factory("pettingzoo.classic.rps_v2:parallel_env")
    with pytest.raises(ConfigError, match="did you mean 'easyrl/TwoRunners-v0'"):
        env_factory("easyrl/TwoRunner-v0")
    with pytest.raises(ConfigError, match="env.kwargs: 'easyrl/TwoRunners-v0' does not take"):
        agent_spaces(ENV_ID, {"lenght": 9})
    with pytest.raises(ConfigError, match="env.kwargs: TwoRunners needs size >= 3"):
        agent_spaces(ENV_ID, {"size": 2})


# --- the config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, match",
    [
        (
            {"policy_mapping": {"runner_0": "p0", "runner_1": "p2"}},
            r"multiagent.policy_mapping.runner_1: unknown policy 'p2'; did you mean 'p1'\?",
        ),
        (
            {"policy_mapping": {"runner_0": "p0"}},
            "multiagent.policy_mapping: agent 'runner_1' has no policy",
        ),
        (
            {"policy_mapping": {"runner_0": "p0", "runner_1": "p1", "runner_2": "p1"}},
            r"has no agent 'runner_2'; did you mean 'runner_1'\?",
        ),
        ({"policies": ["p0", "p1", "p2"]}, "no agent is mapped to 'p2'"),
        ({"policies": ["p0", "p-1"]}, r"multiagent.policies\[1\]: 'p-1' is not a policy name"),
        ({"default_policy": "q"}, "multiagent.default_policy: unknown policy 'q'"),
        ({"polices": ["p0"]}, "did you mean 'multiagent.policies'"),
        ({"policies": []}, "multiagent: policy_mapping and default_policy need policies"),
    ],
)
def test_the_multiagent_section_is_checked_naming_the_key(section, match):
    raw = raw_config({"name": "impala"})
    raw["multiagent"] = {**MAPPING, **section}
    with pytest.raises(ConfigError, match=match):
        config_lib.from_dict(raw)


@pytest.mark.parametrize(
    "override, match",
    [
        ("algorithm.name=a2c", "a2c has no multi-agent training; algorithms with one: dqn"),
        ("cluster.evaluator=1", "cluster.evaluator: a multi-agent run"),
        ("env.vector=async", "env.vector: a multi-agent run"),
    ],
)
def test_what_multiagent_runs_do_not_support_is_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        config_lib.from_dict(raw_config({"name": "impala"}), [override])


def test_a_shared_policy_maps_every_agent_through_the_default():
    raw = raw_config({"name": "ppo"})
    raw["multiagent"] = {"policies": ["shared"], "default_policy": "shared"}
    cfg = config_lib.from_dict(raw)
    assert multiagent.slot_policies(cfg.multiagent, ["runner_0", "runner_1"]).tolist() == [0, 0]
    assert registry.round_share(cfg, 0, 2) == cfg.algorithm.params.rollout_length * 2 * 2
    spec = registry.replay_spec(cfg, *agent_spaces(ENV_ID)[1:])
    assert spec["policy"] == ((), np.dtype(np.int64))


def test_rollout_and_export_refuse_a_multiagent_run(tmp_path):
    from easyrl.tools.checkpoints import load_policy

    config_lib.save(config_lib.from_dict(raw_config({"name": "impala"})), tmp_path / "config.yaml")
    with pytest.raises(EasyRLError, match="no single greedy policy"):
        load_policy(tmp_path)


# --- the agents ------------------------------------------------------------------------------


def build(algorithm: dict, **overrides):
    """A MultiAgent of `algorithm` on TwoRunners (2 copies)."""
    cfg = config_lib.from_dict(raw_config(algorithm), [f"{k}={v}" for k, v in overrides.items()])
    obs_space, action_space = agent_spaces(ENV_ID)[1:]
    return cfg, multiagent.build(cfg, registry.spec(cfg.algorithm.name), obs_space, action_space)


def collect(agent, steps: int, num_envs: int = 2, seed: int = 0):
    """Steps a SlotVectorEnv with `agent`'s collector; returns the items it completed."""
    env = SlotVectorEnv(ENV_ID, num_envs)
    collector = agent.collector(num_envs, seed, 0, 1)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    parts = []
    for _ in range(steps):
        collector.present = env.present.copy()
        next_obs, rewards, terminated, truncated, infos = env.step(collector.act(obs, rng))
        real = next_obs.copy()
        for s in np.flatnonzero(terminated | truncated):
            real[s] = infos["final_obs"][s]
        out = collector.observe(rewards, next_obs, real, terminated, truncated)
        if out is not None:
            parts.append(out)
        obs = next_obs
    return parts


def test_each_policy_has_its_own_prefixed_variables_with_their_own_initial_values():
    _, agent = build({"name": "impala", "unroll_length": 4})
    names = list(agent.variables)
    p0 = [n.removeprefix("p0/") for n in names if n.startswith("p0/")]
    p1 = [n.removeprefix("p1/") for n in names if n.startswith("p1/")]
    assert p0 == p1 and len(p0) * 2 == len(names)
    assert p0 == list(agent.agents[0].variables)
    values = {n: v.numpy() for n, v in agent.variables.items()}
    assert any(not np.allclose(values["p0/" + n], values["p1/" + n]) for n in p0)
    with pytest.raises(EasyRLError, match="no single greedy policy"):
        agent.greedy(np.zeros((1, 3), np.float32))


@pytest.mark.parametrize(
    "algorithm, lstm",
    [
        ({"name": "impala", "unroll_length": 4, "batch_size": 4}, 0),
        ({"name": "impala", "unroll_length": 4, "batch_size": 4}, 8),
        ({"name": "dqn", "batch_size": 8, "n_step": 2}, 0),
    ],
)
def test_a_replay_update_gives_gradients_to_the_policies_in_the_batch_only(
    algorithm, lstm, serve_ps
):
    cfg, agent = build(algorithm, **{"model.lstm": lstm})
    parts = collect(agent, 12)
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    assert set(np.unique(batch["policy"])) == {0, 1}  # both policies' agents collected
    if lstm:  # each slot carries its own state: zero at its first unroll, then the core's
        assert batch["state"].shape == (len(batch["policy"]), 2 * lstm)
        carried = np.abs(batch["state"]).sum(axis=1) > 0
        assert carried.any() and not carried.all()
        assert (batch["first"][~carried, 0] == 1).all()
    p0 = {k: v[batch["policy"] == 0] for k, v in batch.items()}
    step = agent.learn(p0, np.ones(len(p0["policy"]), np.float32))
    sizes = [len(a.variables) for a in agent.agents]
    assert all(g is not None for g in step.grads[: sizes[0]])
    assert all(g is None for g in step.grads[sizes[0] :])  # p1's variables left alone
    assert step.stats and all(k.startswith("p0.") for k in step.stats)
    # The PS takes that push: each policy is its own optimizer group; p1 stays as it was.
    _, client = serve_ps(optimizer=multiagent.optimizer(cfg, registry.module(cfg.algorithm.name)))
    values = {n: v.numpy() for n, v in agent.variables.items()}
    version = assign(client, values).version
    named = {n: g for n, g in zip(agent.variables, step.grads, strict=True) if g is not None}
    reply = push(client, named, version)
    assert reply.applied, reply
    _, after = pull(client)
    assert all(np.array_equal(after[n], values[n]) for n in values if n.startswith("p1/"))
    assert any(not np.array_equal(after[n], values[n]) for n in values if n.startswith("p0/"))
    both = agent.learn(batch, np.ones(len(batch["policy"]), np.float32))
    assert all(g is not None for g in both.grads)
    assert {k.split(".")[0] for k in both.stats} == {"p0", "p1"}
    if algorithm["name"] == "dqn":  # priorities come back in the batch's order
        assert both.priorities is not None and both.priorities.shape == batch["policy"].shape
        np.testing.assert_allclose(
            both.priorities[batch["policy"] == 0], step.priorities, rtol=1e-5
        )


@pytest.mark.parametrize("lstm", [0, 8])
def test_a_ppo_round_waits_for_every_slots_share_and_updates_both_policies(lstm):
    ppo = {"name": "ppo", "rollout_length": 8, "minibatch_size": 16, "num_epochs": 2}
    cfg, agent = build(ppo, **{"model.lstm": lstm})
    share = registry.round_share(cfg, 0, 1)
    steps_per_item = 8 if lstm else 1  # a recurrent round's items: one sequence per slot
    assert share * steps_per_item == 8 * 2 * 2  # rollout_length x slots
    env = SlotVectorEnv(ENV_ID, 2)
    collector = agent.collector(2, 0, 0, 1)
    collector.start_round(share)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    batch, steps = None, 0
    while batch is None:
        collector.present = env.present.copy()
        obs, rewards, terminated, truncated, infos = env.step(collector.act(obs, rng))
        batch = collector.observe(rewards, obs, obs, terminated, truncated)
        steps += 1
    assert steps >= 8 + 3  # runner_1 joins after 3 steps: its slots finish later
    assert len(batch["obs"]) == share
    assert np.bincount(batch["policy"]).tolist() == [16 // steps_per_item] * 2
    updates = list(agent.learn_round(batch, rng))
    assert len(updates) == 2  # each policy: 16 steps in one minibatch, 2 epochs
    assert all(g is not None for g in updates[0].grads)
    assert {k.split(".")[0] for k in updates[0].stats} == {"p0", "p1"}
    with pytest.raises(EasyRLError, match="round share of 30 items over 4 slots"):
        collector.start_round(30)
    if lstm:  # the slots of runner_1 joined late: their sequences start with a reset state
        assert batch["state"].shape == (4, 4 * lstm) and (batch["first"][:, 0] == 1).all()


# --- metrics ---------------------------------------------------------------------------------


def test_run_stats_keep_each_policys_recent_returns():
    stats = RunStats(window=2)
    stats.report("actor", 0, 10, 0, [1.0, 2.0, 3.0], [4, 5, 6], {}, policies=["a", "b", "a"])
    stats.report("actor", 1, 10, 0, [5.0], [2], {}, policies=["a"])
    snap = stats.snapshot()
    assert snap["policy/a/return_mean"] == 4.0  # the last 2 of a: 3, 5
    assert snap["policy/b/return_mean"] == 2.0 and snap["policy/b/length_mean"] == 5.0
    assert snap["policy/a/episodes"] == 3.0 and snap["episodes"] == 4.0
    check_policies([], 3)
    with pytest.raises(ValueError, match="must match episode_returns"):
        check_policies(["a"], 2)
    with pytest.raises(ValueError, match="is not a policy name"):
        check_policies(["a/b"], 1)


# --- real clusters ---------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "config, extra",
    [
        # A small FIFO: the actor waits for the learner (no stop before its first update).
        ("tworunners_impala_multiagent.yaml", ("algorithm.batch_size=4", "replay.capacity=8")),
        ("tworunners_ppo_multiagent.yaml", ("algorithm.rollout_length=8",)),
        (
            "tworunners_apex_multiagent.yaml",
            (
                "algorithm.batch_size=16",
                "replay.min_size_to_sample=100",
                "replay.samples_per_insert=1",  # the actor waits for the learner's samples
                "replay.error_buffer=200",
            ),
        ),
    ],
)
def test_a_multiagent_cluster_trains_two_policies_and_reports_each(launch, config, extra):
    run = launch(
        "stop.max_env_steps=1500",
        "stop.max_seconds=60",
        "env.num_envs=2",
        "cluster.actor=1",
        *extra,
        config=ROOT / "configs" / config,
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(100)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    ps0 = _counters(summary, "ps/0")
    assert ps0["env_steps"] >= 1500 and ps0["updates"] > 0 and ps0["ps/0/applied"] > 0, ps0
    assert ps0["policy/p0/episodes"] > 0 and ps0["policy/p1/episodes"] > 0, ps0
    assert any(k.startswith("learner/p0.") for k in ps0) and any(
        k.startswith("learner/p1.") for k in ps0
    ), ps0
    last = run.metrics()[-1]
    for policy in ("p0", "p1"):
        assert np.isfinite(last[f"policy/{policy}/return_mean"]), last
        assert last[f"policy/{policy}/length_mean"] >= 1, last
    learner = (run.run_dir / "logs" / "learner-0.log").read_text()
    assert "policy int64[" in learner, learner
    tb = list((run.run_dir / "tb").glob("events.*"))
    assert tb and any(b"policy/p1/return_mean" in f.read_bytes() for f in tb)
    _assert_no_processes_left(run.run_dir)


def test_configs_load_with_their_multiagent_sections():
    for name in ("tworunners_impala_multiagent.yaml", "tworunners_ppo_multiagent.yaml"):
        cfg = config_lib.load(ROOT / "configs" / name)
        assert cfg.multiagent.enabled and cfg.multiagent.policies == ("p0", "p1")
        assert dataclasses.asdict(cfg.multiagent)["policy_mapping"] == MAPPING["policy_mapping"]
