"""`easyrl.load` and `Policy.predict`, and `easyrl.train`'s callbacks.

Most run directories are made without training, as in test_tools.py (the config saved, random
weights written by real PS shards); two tests train for real (marked `cluster`): one through
`easyrl.train` with a callback that stops it and whose policy is then loaded from the run and
from its export, one that runs `examples/python_api.py` as a user would.
"""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from test_tools import make_run, random_values, write_latest

import easyrl
from easyrl.algorithms.agent_parts import greedy_policy
from easyrl.callbacks import Callback, CallbackRunner
from easyrl.envs import env_options, make_vector_env
from easyrl.envs.flat import FlatObservation
from easyrl.errors import EasyRLError
from easyrl.policy import EpisodePlayer
from easyrl.tools.checkpoints import load_policy
from easyrl.tools.export import export
from easyrl.tools.rollout import rollout

ROOT = Path(__file__).resolve().parent.parent

DQN = {"algorithm": {"name": "dqn"}, "env": {"id": "CartPole-v1"}, "model": {"hidden": [16]}}
MASKED = {  # a Dict observation with an action mask
    "algorithm": {"name": "impala"},
    "env": {"id": "easyrl/MaskedChoice-v0"},
    "model": {"hidden": [8]},
}
LSTM = {
    "algorithm": {"name": "ppo", "rollout_length": 8},
    "env": {"id": "easyrl/StatelessCartPole-v1"},
    "model": {"hidden": [8], "lstm": 8},
}


def trained_like(tmp_path, name: str, raw: dict, seed: int = 0):
    """A run directory holding random weights as PS checkpoints, and its export."""
    run_dir, cfg, algo = make_run(tmp_path, name, raw)
    write_latest(run_dir, cfg, random_values(algo, seed))
    return run_dir, export(run_dir, tmp_path / f"{name}-export")


def observations(cfg, count: int, seed: int = 0) -> np.ndarray:
    """`count` observations `[count, ...]` of the run's env, played with random actions."""
    env = make_vector_env(cfg.env.id, 1, seed=seed, **env_options(cfg.env))
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(count):
        rows.append(obs[0])
        obs, *_ = env.step(env.action_space.sample())
    env.close()
    return np.stack(rows)


# --- predict on runs and exports -----------------------------------------------------------


def test_a_run_and_its_export_take_the_actions_rollout_takes(tmp_path):
    run_dir, out = trained_like(tmp_path, "dqn", DQN, seed=1)
    loaded = load_policy(run_dir)
    obs = observations(loaded.cfg, 100)
    # What `easyrl rollout` played before it went through `predict`.
    expected = greedy_policy(loaded.algo, bool(loaded.cfg.model.lstm))(obs)
    assert len(set(expected.tolist())) == 2  # random weights: both actions occur
    for policy in (easyrl.load(run_dir), easyrl.load(out)):
        actions, state = policy.predict(obs)
        assert state is None and actions.dtype == np.int64
        np.testing.assert_array_equal(actions, expected)
        action, _ = policy.predict(obs[7])  # one observation: one action
        assert np.ndim(action) == 0 and action == expected[7]
    run_policy = easyrl.load(run_dir)
    assert run_policy.checkpoint == "latest" and run_policy.state_size == 0
    assert "dqn on CartPole-v1" in repr(run_policy)
    assert len(rollout(run_dir, episodes=2, seed=1, quiet=True).returns) == 2  # via predict


def test_dict_observations_are_flattened_and_masked_as_the_envs_do(tmp_path):
    run_dir, out = trained_like(tmp_path, "masked", MASKED, seed=3)
    raw = gymnasium.make("easyrl/MaskedChoice-v0")
    flat = FlatObservation(gymnasium.make("easyrl/MaskedChoice-v0"))
    dicts = []
    obs, _ = raw.reset(seed=0)
    for _ in range(40):
        dicts.append(obs)
        obs, _, terminated, truncated, _ = raw.step(int(np.flatnonzero(obs["action_mask"])[0]))
        if terminated or truncated:
            obs, _ = raw.reset()
    vectors = np.stack([flat.observation(d) for d in dicts])
    expected = load_policy(run_dir).algo.greedy(vectors)
    assert len(set(expected.tolist())) > 1
    batched = {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}  # a vector env's Dict
    for policy in (easyrl.load(run_dir), easyrl.load(out)):
        for given in (vectors, dicts, batched):
            np.testing.assert_array_equal(policy.predict(given)[0], expected)
        assert policy.predict(dicts[5])[0] == expected[5]
        legal = np.stack([d["action_mask"] for d in dicts]).astype(bool)
        assert legal[np.arange(len(dicts)), expected].all()  # never a masked action
    with pytest.raises(EasyRLError, match="does not fit"):
        easyrl.load(run_dir).predict({"payoff": dicts[0]["payoff"]})


def test_a_recurrent_policy_carries_its_state(tmp_path):
    run_dir, out = trained_like(tmp_path, "lstm", LSTM, seed=1)
    loaded = load_policy(run_dir)
    assert loaded.algo.state_size == 32
    obs = observations(loaded.cfg, 100, seed=2)
    # Sequential stepping of the agent, as rollout and the evaluator play: 4 envs, 25 steps,
    # episodes of env 1 restarting at step 10 and of env 3 at step 17.
    sequence = obs.reshape(25, 4, -1)
    starts = np.zeros((25, 4), bool)
    starts[10, 1] = starts[17, 3] = True
    reference = greedy_policy(loaded.algo, bool(loaded.cfg.model.lstm))
    expected = []
    for t in range(25):
        expected.append(reference(sequence[t]))
        if t + 1 < 25:
            reference.end_episodes(starts[t + 1])
    for policy in (easyrl.load(run_dir), easyrl.load(out)):
        assert policy.state_size == 32
        state = None
        for t in range(25):
            actions, state = policy.predict(sequence[t], state=state, episode_start=starts[t])
            np.testing.assert_array_equal(actions, expected[t], err_msg=f"step {t}")
        assert state is not None and state.shape == (4, 32)
        player = EpisodePlayer(policy)  # how `easyrl rollout` plays: the same actions
        for t in range(25):
            np.testing.assert_array_equal(player(sequence[t]), expected[t], err_msg=f"step {t}")
            if t + 1 < 25:
                player.end_episodes(starts[t + 1])
        # The output depends on the state: other states, other actions and next states.
        other = np.random.default_rng(0).normal(0.0, 2.0, (100, 32)).astype(np.float32)
        initial_actions, initial_state = policy.predict(obs)
        other_actions, other_state = policy.predict(obs, state=other)
        assert initial_state is not None and other_state is not None
        assert (initial_actions != other_actions).any()
        assert not np.allclose(initial_state, other_state)
        # An episode start restarts from the initial state, whatever state is passed.
        restarted, _ = policy.predict(obs, state=other, episode_start=np.ones(100, bool))
        np.testing.assert_array_equal(restarted, initial_actions)
        # One observation: its state is [state_size], and it continues as the batch's row.
        action, one_state = policy.predict(obs[3], state=other[3])
        assert one_state is not None
        assert one_state.shape == (32,) and action == other_actions[3]
        np.testing.assert_allclose(one_state, other_state[3], rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_clear_errors(tmp_path):
    run_dir, out = trained_like(tmp_path, "dqn", DQN)
    policy = easyrl.load(run_dir)
    with pytest.raises(EasyRLError, match=r"shape \(4,\) or a batch \[N, 4\], got .* \(3,\)"):
        policy.predict(np.zeros(3))
    with pytest.raises(EasyRLError, match="no recurrent state"):
        policy.predict(np.zeros(4), state=np.zeros(8))
    with pytest.raises(EasyRLError, match="deterministic=False is not supported"):
        policy.predict(np.zeros(4), deterministic=False)
    with pytest.raises(EasyRLError, match="episode_start must be 2 flags"):
        policy.predict(np.zeros((2, 4)), episode_start=[True])
    with pytest.raises(EasyRLError, match="got a dict observation"):
        policy.predict({"x": 1})
    with pytest.raises(EasyRLError, match="is an export"):
        easyrl.load(out, checkpoint="best")
    with pytest.raises(EasyRLError, match="neither a run directory"):
        easyrl.load(tmp_path)
    with pytest.raises(EasyRLError, match="does not exist"):
        easyrl.load(tmp_path / "missing")
    lstm_run, _ = trained_like(tmp_path, "lstm", LSTM)
    with pytest.raises(EasyRLError, match=r"state must be \[2, 32\]"):
        easyrl.load(lstm_run).predict(np.zeros((2, 2)), state=np.zeros((3, 32)))


# --- callbacks ---------------------------------------------------------------------------


class Recorder(Callback):
    """Records every hook call; stops the run once `stop_when(self)` holds."""

    def __init__(self, stop_when=lambda recorder: False):
        self.rows, self.evaluations, self.checkpoints, self.stops = [], [], [], []
        self.stop_when = stop_when

    def on_progress(self, row):
        self.rows.append(row)
        if self.stop_reason is None and self.stop_when(self):
            return self.stop(f"seen {len(self.rows)} rows")

    def on_evaluation(self, eval_return, counters):
        self.evaluations.append((eval_return, counters["eval_count"]))

    def on_checkpoint(self, path):
        self.checkpoints.append(path.name)

    def on_stop(self, reason):
        self.stops.append(reason)


def append_row(run_dir: Path, row: dict, torn: str = "") -> None:
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n" + torn)


def test_callback_runner_reports_what_is_new_and_stops_when_asked(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    append_row(tmp_path, {"time_s": 1.0, "env_steps": 10})  # a resumed run's earlier row
    (tmp_path / "checkpoints" / "ps-0.npz").write_bytes(b"old")
    recorder = Recorder(stop_when=lambda r: len(r.rows) >= 2)

    class Plain(Callback):  # SB3's way: a hook returns False
        def on_evaluation(self, eval_return, counters):
            return eval_return >= 100  # go on while the evaluations stay good

    runner = CallbackRunner([recorder, Plain()], tmp_path, resumed=True)
    assert runner.poll({"eval_count": 3.0, "eval_return_mean": 5.0}) is None  # resumed: seen
    append_row(tmp_path, {"time_s": 2.0, "env_steps": 20}, torn='{"time_s": 3')
    (tmp_path / "checkpoints" / "ps-0.tmp.npz").write_bytes(b"being written")
    (tmp_path / "checkpoints" / "best.npz").write_bytes(b"new")
    assert runner.poll({"eval_count": 4.0, "eval_return_mean": 150.0}) is None
    assert recorder.rows == [{"time_s": 2.0, "env_steps": 20}]  # the torn row waits
    assert recorder.evaluations == [(150.0, 4.0)] and recorder.checkpoints == ["best.npz"]
    assert runner.poll({"eval_count": 5.0, "eval_return_mean": 50.0}) == (
        "stopped by callback Plain: on_evaluation returned False"
    )
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('.0, "env_steps": 30}\n')
    assert runner.poll({"eval_count": 5.0}) == "stopped by callback Recorder: seen 2 rows"
    runner.finish("stopped by callback Recorder: seen 2 rows")
    assert recorder.stops == ["stopped by callback Recorder: seen 2 rows"]
    assert runner.error is None


def test_a_raising_callback_stops_the_run_and_its_error_is_kept(tmp_path):
    class Broken(Callback):
        def on_progress(self, row):
            raise ValueError("my bug")

    runner = CallbackRunner([Broken()], tmp_path)
    append_row(tmp_path, {"time_s": 1.0})
    assert runner.poll({}) == "callback Broken.on_progress raised ValueError: my bug"
    assert isinstance(runner.error, ValueError)
    with pytest.raises(EasyRLError, match="expected easyrl.Callback instances, got function"):
        CallbackRunner([lambda row: None], tmp_path)  # type: ignore[list-item]
    with pytest.raises(EasyRLError, match="expected a list"):
        CallbackRunner(Broken(), tmp_path)  # type: ignore[arg-type]


# --- real runs ---------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_callback_stops_a_real_run_whose_policy_then_acts_as_rollout(tmp_path):
    def enough(recorder: Recorder) -> bool:
        trained = [r for r in recorder.rows if r.get("updates", 0) > 0]
        return bool(recorder.evaluations and recorder.checkpoints and len(trained) >= 2)

    recorder, progress = Recorder(stop_when=enough), io.StringIO()
    result = easyrl.train(
        ROOT / "configs" / "cartpole_ppo.yaml",
        callbacks=[recorder],
        cluster={"actor": 1, "evaluator": 1},
        eval={"interval_s": 1, "episodes": 2},
        run={"dir": str(tmp_path / "run"), "log_interval_s": 0.5, "checkpoint_interval_s": 2},
        stop={"max_seconds": 120},
        out=progress,
    )
    assert re.fullmatch(r"stopped by callback Recorder: seen \d+ rows", result.reason), (
        f"{result.reason}\n{progress.getvalue()}"
    )
    assert result.exit_code == 1 and not result.reached_goal
    assert progress.getvalue().endswith(f": {result.reason}\n")  # the last line says so
    assert result.summary["reason"] == result.reason
    assert recorder.stops == [result.reason]
    written = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert recorder.rows == written  # every row, those written while stopping too
    counts = [count for _, count in recorder.evaluations]  # polls may see several at once
    assert counts and counts[0] >= 1.0 and counts == sorted(set(counts)), counts
    assert "ps-0.npz" in recorder.checkpoints and "best.npz" in recorder.checkpoints

    out = export(result.run_dir, tmp_path / "export")
    loaded = load_policy(result.run_dir)
    obs = observations(loaded.cfg, 100)
    expected = greedy_policy(loaded.algo, bool(loaded.cfg.model.lstm))(obs)
    for policy in (easyrl.load(result.run_dir), easyrl.load(out)):
        np.testing.assert_array_equal(policy.predict(obs)[0], expected)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_the_python_api_example_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"EASYRL_TOKEN", "EASYRL_CLUSTER"}}
    env["PYTHONPATH"] = str(ROOT)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    command = [sys.executable, str(ROOT / "examples" / "python_api.py"), "--target", "15"]
    command += ["--seconds", "90", "--dir", str(tmp_path / "run")]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "stopped: stopped by callback StopAtReturn: mean return" in done.stdout
    assert "one episode with policy.predict: return" in done.stdout
    assert (tmp_path / "run" / "summary.json").is_file()
