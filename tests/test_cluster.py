"""End-to-end tests of the local cluster: `easyrl train` with every role as a real process.

Each role is a separate Python process importing TensorFlow, so a small cluster takes
10-20 s to start on a 2-core machine. Every test polls with deadlines (no fixed sleeps
beyond short poll intervals) and a fixture kills whatever a failed test leaves behind
(the launcher by its pid; its children by the pids found in /proc referencing the run
directory, which only processes of this test's run can contain).

Budgets: actors step CartPole far faster than the learner gets its first compiled
update, so with a pure env-step budget a run can stop before a single gradient was
applied. The runs below couple actors to the learner with the replay rate limiter
(`samples_per_insert=1`, `error_buffer=400`): a memory shard accepts at most
`min_size_to_sample + error_buffer` inserts beyond what was sampled, so reaching the
env-step budget requires the learner to have sampled (and so trained on) most of it.
The kill-and-restart tests need progress after a restart whose time no budget can
foresee: they poll for that evidence, then stop the run with Ctrl-C (`Run.interrupt`);
their `stop.max_seconds` is only a backstop.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from easyrl import config as config_lib

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "cartpole_apex.yaml"

BASE_OVERRIDES = (
    "stop.episode_return_mean=null",  # a budget stop counts as success (exit 0)
    "replay.min_size_to_sample=200",
    "replay.samples_per_insert=1.0",
    "replay.error_buffer=400",
    "algorithm.batch_size=32",
    "run.log_interval_s=0.5",
    "env.num_envs=4",
)


# --- helpers ---------------------------------------------------------------------------


def one_each(actors: int = 1) -> tuple[str, ...]:
    """Overrides for the smallest cluster: 1 PS, 1 memory, 1 learner and `actors` actors."""
    return ("cluster.ps=1", "cluster.memory=1", "cluster.learner=1", f"cluster.actor={actors}")


def _env() -> dict[str, str]:
    """The environment of every command: this checkout first, no token, no cluster."""
    env = {k: v for k, v in os.environ.items() if k not in {"EASYRL_TOKEN", "EASYRL_CLUSTER"}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cmdlines() -> dict[int, list[str]]:
    """{pid: argv} of every live process that can be read (zombies have no argv)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            out[int(entry.name)] = raw.rstrip(b"\0").decode(errors="replace").split("\0")
    return out


def _processes_referencing(text: str) -> dict[int, str]:
    """{pid: command line} of the processes (other than this one) whose argv contains `text`."""
    me = os.getpid()
    return {
        pid: " ".join(argv)
        for pid, argv in _cmdlines().items()
        if pid != me and any(text in arg for arg in argv)
    }


def _role_pids(config_path: Path, role: str, task: int) -> list[int]:
    """Pids of `easyrl run --role ROLE --task TASK --config CONFIG_PATH` processes."""
    want = ["--role", role, "--task", str(task), "--config", str(config_path)]
    pids = []
    for pid, argv in _cmdlines().items():
        if any(argv[i : i + len(want)] == want for i in range(len(argv))):
            pids.append(pid)
    return pids


def _assert_no_processes_left(run_dir: Path, grace_s: float = 5.0) -> None:
    """Fails when a process still references `run_dir` `grace_s` after the launcher exited."""
    deadline = time.monotonic() + grace_s
    while True:
        left = _processes_referencing(str(run_dir))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, "processes of the run left running:\n" + "\n".join(
        f"  {pid}: {cmd}" for pid, cmd in left.items()
    )


def _segments() -> set[str]:
    """easyrl's shared-memory segments (`easyrl.transport.shm`) now."""
    from easyrl.transport import shm

    return {path.name for path in shm.SHM_DIR.glob("easyrl-*")}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines file being appended to (a torn last line is
    left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        records.append(json.loads(line))
    return records


class Run:
    """One `easyrl train` launcher process, its output in a file, its run directory."""

    def __init__(self, tmp_path: Path, overrides, config: Path = CONFIG, base=BASE_OVERRIDES):
        self.run_dir = (tmp_path / "run").resolve()
        self.config_path = self.run_dir / "config.yaml"
        self.out_path = tmp_path / "launcher.out"
        command = [sys.executable, "-m", "easyrl.cli", "train", str(config)]
        for override in (*base, f"run.dir={self.run_dir}", *overrides):
            command += ["--set", override]
        self.started = time.monotonic()
        self.segments_before = _segments()
        with self.out_path.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmp_path,
                env=_env(),
            )

    def wait(self, timeout_s: float) -> int:
        """Waits for the launcher to exit; fails the test (showing its output) if it does not."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launcher still running after {timeout_s:.0f}s:\n{self.output()}")

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def metrics(self) -> list[dict]:
        return _read_jsonl(self.run_dir / "metrics.jsonl")

    def summary(self) -> dict:
        path = self.run_dir / "summary.json"
        assert path.exists(), f"no summary.json; launcher output:\n{self.output()}"
        return json.loads(path.read_text())

    def logs(self) -> str:
        """The tails of every role's log (for failure messages)."""
        parts = []
        for log in sorted((self.run_dir / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-8:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def poll_until(self, predicate, timeout_s: float, what: str):
        """Polls `predicate()` until it returns something truthy (returned); fails when the
        launcher exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.process.poll() is not None:
                pytest.fail(
                    f"launcher exited ({self.process.returncode}) before {what}:\n"
                    f"{self.output()}\n{self.logs()}"
                )
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}:\n{self.output()}")

    def interrupt(self, timeout_s: float = 60) -> dict:
        """Ctrl-C, once the launcher runs the cluster (interrupted while it still waits for
        the servers, its summary can miss their final Status): the launcher stops every
        role, writes its summary and exits 130; returns the summary. Tests whose evidence
        is in before a budget would end the run (a restart, an evaluation) end it so."""
        self.poll_until(lambda: "] env steps" in self.output(), 60, "the first progress line")
        self.process.send_signal(signal.SIGINT)
        code = self.wait(timeout_s)
        assert code == 130, f"exit code {code}:\n{self.output()}\n{self.logs()}"
        summary = self.summary()
        assert summary["reason"] == "interrupted" and summary["exit_code"] == 130, summary
        return summary

    def signal_role(self, role: str, task: int, signum: int) -> int:
        """Sends `signum` to the one process of `role` `task` of this run, once the launcher
        runs the cluster (a server lost while the launcher still waits for the servers to
        answer is a failed start-up, which ends the run); returns its pid."""
        self.poll_until(lambda: "] env steps" in self.output(), 60, "the first progress line")
        pids = _role_pids(self.config_path, role, task)
        assert len(pids) == 1, (role, task, pids)
        os.kill(pids[0], signum)
        return pids[0]

    def cleanup(self) -> None:
        """Stops the launcher (SIGTERM = Ctrl-C, then SIGKILL) and kills its leftovers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in _processes_referencing(str(self.run_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def launch(tmp_path):
    """`launch(*overrides, config=..., base=...)` starts `easyrl train` in the background;
    cleaned up afterwards."""
    runs = []

    def start(*overrides, config: Path = CONFIG, base=BASE_OVERRIDES) -> Run:
        run = Run(tmp_path, overrides, config, base)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.cleanup()


def _counters(summary: dict, server: str) -> dict:
    status = summary["servers"].get(server)
    assert status, f"{server} did not answer the final Status: {summary['servers']}"
    return status["counters"]


# --- tests -----------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_train_short_run_moves_every_counter(launch):
    budget = 3000
    run = launch(
        f"stop.max_env_steps={budget}",
        "stop.max_seconds=90",
        *one_each(2),
    )
    code = run.wait(150)
    output = run.output()
    assert code == 0, f"exit code {code}:\n{output}\n{run.logs()}"
    assert f"run directory: {run.run_dir}" in output
    assert re.search(r"env steps\s+[\d,]+ \(", output), output  # progress lines

    summary = run.summary()
    assert summary["exit_code"] == 0
    assert "max_env_steps" in summary["reason"], summary["reason"]
    assert summary["restarts"] == {
        "ps-0": 0,
        "memory-0": 0,
        "learner-0": 0,
        "actor-0": 0,
        "actor-1": 0,
    }

    ps = _counters(summary, "ps/0")
    assert ps["env_steps"] >= budget
    assert ps["updates"] > 0
    assert ps["episodes"] > 0
    assert ps["actor/0/env_steps"] > 0
    assert ps["actor/1/env_steps"] > 0
    assert ps["actor/0/env_steps"] + ps["actor/1/env_steps"] == ps["env_steps"]
    assert ps["learner/0/updates"] > 0
    # The only learner applies its own updates and publishes them: nothing is pushed.
    assert ps["ps/0/applied"] > 0 and ps["ps/0/pushes"] == 0
    assert ps["ps/0/version"] > 1
    assert ps["ps/0/shm_replies"] > 0  # weights pulled through shared memory: one host
    assert summary["servers"]["ps/0"]["stopping"] is True
    memory = _counters(summary, "memory/0")
    assert memory["memory/0/inserts"] > 0
    assert memory["memory/0/samples"] > 0
    # The learner shares the shard's host: its batches came through shared memory, and no
    # segment outlives the run.
    assert memory["memory/0/shm_replies"] > 0 and not memory.get("memory/0/shm_refused")
    assert memory["memory/0/shm_requests"] > 0  # the actors' inserts too
    assert not _segments() - run.segments_before, _segments() - run.segments_before

    metrics = run.metrics()
    assert len(metrics) >= 2
    steps = [m.get("env_steps", 0.0) for m in metrics]  # absent before the first report
    assert steps == sorted(steps), steps
    assert steps[0] < steps[-1]
    times = [m["time_s"] for m in metrics]
    assert times == sorted(times)
    stops = [m["stop"] for m in metrics if "stop" in m]  # only on the deciding line
    assert stops == [summary["reason"]], stops

    cfg = config_lib.load(run.config_path)
    assert cfg.run.dir == str(run.run_dir)
    assert cfg.stop.max_env_steps == budget
    assert cfg.stop.max_seconds == 90
    assert cfg.stop.episode_return_mean is None
    assert cfg.replay.min_size_to_sample == 200
    assert cfg.replay.samples_per_insert == 1.0
    assert cfg.algorithm.params.batch_size == 32
    assert cfg.run.log_interval_s == 0.5
    assert cfg.env.num_envs == 4
    assert (cfg.cluster.ps, cfg.cluster.memory, cfg.cluster.learner, cfg.cluster.actor) == (
        1,
        1,
        1,
        2,
    )

    checkpoint = run.run_dir / "checkpoints" / "ps-0.npz"
    assert checkpoint.exists()
    with np.load(checkpoint) as data:
        meta = json.loads(data["meta"].tobytes())
        assert any(k.startswith("var/") for k in data.files)
    # The final checkpoint is written after the summary's Status snapshot.
    assert meta["version"] >= summary["servers"]["ps/0"]["version"] > 1

    # A quiet console: neither the expected start-up wait nor TensorFlow's GPU probe (on a
    # CPU-only machine) prints anything, on the console or in a role's log.
    noise = ("unreachable", "cuInit", "absl::InitializeLog", "Could not find cuda")
    assert not [n for n in noise if n in output], output
    for role in ("ps-0", "memory-0", "learner-0", "actor-0", "actor-1"):
        log = (run.run_dir / "logs" / f"{role}.log").read_text()
        assert not [n for n in noise if n in log], log
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_two_shards_each(launch):
    # A larger budget than the single-shard test: each memory shard is fed by one actor,
    # so both actors must be up and inserting (and both shards sampled) before the stop.
    run = launch(
        "stop.max_env_steps=8000",
        "stop.max_seconds=90",
        "cluster.ps=2",
        "cluster.memory=2",
        "cluster.learner=1",
        "cluster.actor=2",
        "cluster.threads.learner=3",
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert set(summary["servers"]) == {"ps/0", "ps/1", "memory/0", "memory/1"}
    # Each process ran TensorFlow on the thread budget the launcher gave it: the config's
    # for the learner, 1 (inter-op 2) for the others; a memory shard runs no TensorFlow.
    pools = {"learner-0": (3, 3), "ps-0": (1, 2), "ps-1": (1, 2), "actor-0": (1, 2)}
    for name, (intra, inter) in pools.items():
        log = (run.run_dir / "logs" / f"{name}.log").read_text()
        line = f"thread budget {intra} (EASYRL_THREADS): TensorFlow intra-op {intra}, "
        assert line + f"inter-op {inter} threads" in log, log
    shares = r"threads per process on \d+ cores: ps 1, memory 1, learner 3, actor 1\n"
    assert re.search(shares, run.output()), run.output()
    memory_log = (run.run_dir / "logs" / "memory-1.log").read_text()
    assert "thread budget 1 (EASYRL_THREADS); no TensorFlow" in memory_log, memory_log
    assert all(n == 0 for n in summary["restarts"].values()), summary["restarts"]

    ps0, ps1 = _counters(summary, "ps/0"), _counters(summary, "ps/1")
    assert ps0["ps/0/applied"] > 0
    assert ps1["ps/1/applied"] > 0
    assert ps0["ps/0/version"] > 1
    assert ps1["ps/1/version"] > 1
    assert "env_steps" not in ps1  # only shard 0 is the metrics hub
    assert ps0["actor/0/env_steps"] > 0
    assert ps0["actor/1/env_steps"] > 0
    for shard in (0, 1):
        memory = _counters(summary, f"memory/{shard}")
        assert memory[f"memory/{shard}/inserts"] > 0, memory
        assert memory[f"memory/{shard}/samples"] > 0, memory
    for shard in (0, 1):
        assert (run.run_dir / "checkpoints" / f"ps-{shard}.npz").exists()
    _assert_no_processes_left(run.run_dir)


ROUNDS = {
    # PPO: 2 actors x 4 envs x 16 steps = 128 steps a round; observation statistics on, so
    # the learner also assigns them to the PS after every round.
    "ppo": (
        ROOT / "configs" / "cartpole_ppo.yaml",
        (
            "algorithm.rollout_length=16",
            "algorithm.num_epochs=2",
            "algorithm.minibatch_size=64",
            "algorithm.normalize_observations=true",
            "stop.max_env_steps=1500",
        ),
    ),
    # PPO with LSTM networks: a round is 2 actors x 4 envs = 8 sequences of 16 steps, each
    # with the cores' states before its first step; observation statistics on.
    "ppo-lstm": (
        ROOT / "configs" / "stateless_cartpole_ppo_lstm.yaml",
        (
            "algorithm.rollout_length=16",
            "algorithm.num_epochs=2",
            "algorithm.minibatch_size=64",
            "algorithm.normalize_observations=true",
            "model.lstm=8",
            "stop.max_env_steps=1500",
        ),
    ),
    # A2C: 2 actors x 4 envs x 16 steps = 128 steps a round, one gradient step each.
    "a2c": (
        ROOT / "configs" / "cartpole_a2c.yaml",
        ("algorithm.rollout_length=16", "stop.max_env_steps=1500"),
    ),
    # ES: 8 perturbation pairs a round, episodes cut at 40 steps.
    "es": (
        ROOT / "configs" / "cartpole_es.yaml",
        ("algorithm.population=8", "env.max_episode_steps=40", "stop.max_env_steps=4000"),
    ),
}


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", sorted(ROUNDS))
def test_synchronous_rounds_two_shards_each(launch, algorithm):
    config, overrides = ROUNDS[algorithm]
    run = launch(
        *overrides,
        "stop.max_seconds=90",
        "env.num_envs=4",
        "cluster.ps=2",
        "cluster.memory=2",
        "cluster.actor=2",
        config=config,
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert "max_env_steps" in summary["reason"], summary["reason"]
    assert all(n == 0 for n in summary["restarts"].values()), summary["restarts"]
    ps0, ps1 = _counters(summary, "ps/0"), _counters(summary, "ps/1")
    rounds = ps0["ps/0/round"]
    assert rounds >= 3, ps0
    # The learner publishes every round on every shard (in parallel), after that round's
    # pushes; the stop can land between the two publishes of the last round.
    assert abs(ps1["ps/1/round"] - rounds) <= 1, (ps0, ps1)
    rounds = min(rounds, ps1["ps/1/round"])
    assert ps0["ps/0/applied"] >= rounds - 1 and ps1["ps/1/applied"] >= rounds - 1
    assert ps0["learner/0/updates"] > 0
    for shard in (0, 1):
        memory = _counters(summary, f"memory/{shard}")
        # Each shard released whole rounds of its one actor, and is now collecting the
        # next round (or already holds part of it). The stop can land while the learner
        # trains on a released round it has not yet published (released = rounds + 1).
        released = memory[f"memory/{shard}/rounds_released"]
        assert rounds - 1 <= released <= rounds + 1, (rounds, memory)
        assert memory[f"memory/{shard}/round"] == released, memory
        assert memory[f"memory/{shard}/samples"] > 0
        assert memory.get(f"memory/{shard}/refused_stale", 0) == 0, memory
    if algorithm.startswith("ppo"):
        with (
            np.load(run.run_dir / "checkpoints" / "ps-0.npz") as data0,
            np.load(run.run_dir / "checkpoints" / "ps-1.npz") as data1,
        ):
            counts = [d[k] for d in (data0, data1) for k in d.files if k.endswith("obs_norm/count")]
        assert len(counts) == 1 and counts[0] >= 128, counts  # updated by every round
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_impala_lstm_two_learners_two_memories(launch):
    """IMPALA with an LSTM policy (the state travels with the unrolls) on 2 of each role."""
    run = launch(
        "stop.max_env_steps=20000",
        "stop.max_seconds=90",
        "env.num_envs=4",
        "algorithm.batch_size=4",
        "cluster.ps=2",
        "cluster.memory=2",
        "cluster.learner=2",
        "cluster.actor=2",
        config=ROOT / "configs" / "stateless_cartpole_impala_lstm.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert all(n == 0 for n in summary["restarts"].values()), summary["restarts"]
    ps0, ps1 = _counters(summary, "ps/0"), _counters(summary, "ps/1")
    assert ps0["learner/0/updates"] > 0 and ps0["learner/1/updates"] > 0, ps0
    assert ps0["ps/0/applied"] > 0 and ps1["ps/1/applied"] > 0
    for shard in (0, 1):
        memory = _counters(summary, f"memory/{shard}")
        # Every unroll is delivered once: what was sampled was inserted, and in batches.
        inserted, sampled = memory[f"memory/{shard}/inserts"], memory[f"memory/{shard}/samples"]
        assert 0 < sampled <= inserted, memory
        assert sampled % 4 == 0, memory
    # The learners saw unrolls: [batch, T + 1, obs] observations, one action per step, and
    # the LSTM state (64 units: c and h) each unroll starts from, episode starts per step.
    logs = "".join((run.run_dir / "logs" / f"learner-{i}.log").read_text() for i in (0, 1))
    assert logs.count("first batch: action int64[4, 20], discount float32[4, 20]") == 2, logs
    assert "obs float32[4, 21, 2]" in logs
    assert "state float32[4, 128]" in logs and "first float32[4, 21]" in logs
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a3c_runs_with_only_ps_and_actors(launch):
    run = launch(
        "stop.max_env_steps=6000",
        "stop.max_seconds=90",
        "env.num_envs=4",
        "cluster.ps=2",
        "cluster.actor=2",
        config=ROOT / "configs" / "cartpole_a3c.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert set(summary["restarts"]) == {"ps-0", "ps-1", "actor-0", "actor-1"}
    assert set(summary["servers"]) == {"ps/0", "ps/1"}
    ps0, ps1 = _counters(summary, "ps/0"), _counters(summary, "ps/1")
    # Each actor pushed its own gradients; both shards applied them.
    assert ps0["actor/0/updates"] > 0 and ps0["actor/1/updates"] > 0, ps0
    assert ps0["ps/0/applied"] >= ps0["updates"] > 0
    assert ps1["ps/1/applied"] > 0
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_pong_impala_ships_uint8_frames_to_the_learner(launch):
    run = launch(
        "stop.max_env_steps=1500",
        "stop.max_seconds=150",
        "env.num_envs=2",
        "env.vector=sync",
        "algorithm.unroll_length=16",
        "algorithm.batch_size=2",
        # A short FIFO couples the actors to the learner: inserts wait until the queue has
        # room. The actors' queues, in-flight inserts, the queue and the prefetch hold ~20
        # unrolls (~600 steps) the learner never has to take, so 1,500 steps (47 unrolls)
        # cannot run out before the learner has trained on more than 20 of them.
        "replay.capacity=4",
        "replay.prefetch=1",
        "learner.updates_per_report=1",
        *one_each(2),
        config=ROOT / "configs" / "pong_impala.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=1"),
    )
    code = run.wait(200)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    ps0 = _counters(summary, "ps/0")
    # The learner trained: its gradients reached the PS (under load its first Report can
    # come after the env-step budget ran out).
    assert ps0["env_steps"] >= 1500 and ps0["ps/0/applied"] > 0, ps0
    log = (run.run_dir / "logs" / "learner-0.log").read_text()
    # 42x42 grey frames, 4 stacked, as uint8 all the way: [batch, T + 1, 42, 42, 4].
    assert "obs uint8[2, 17, 42, 42, 4]" in log, log
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_continuous_control_with_an_evaluator(launch, algorithm):
    run = launch(
        "stop.max_env_steps=3000",
        "stop.max_seconds=120",
        "stop.eval_return_mean=null",
        "algorithm.random_steps=200",
        "algorithm.batch_size=64",
        "replay.min_size_to_sample=200",
        "replay.samples_per_insert=16",
        "replay.error_buffer=500",
        "model.hidden=[32]",
        "eval.episodes=2",
        "eval.num_envs=2",
        "eval.interval_s=0.5",
        "env.max_episode_steps=50",
        config=ROOT / "configs" / f"pendulum_{algorithm}.yaml",
        base=("run.log_interval_s=0.5",),
    )
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    summary = run.summary()
    assert all(n == 0 for n in summary["restarts"].values()), summary["restarts"]
    assert "evaluator-0" in summary["restarts"]
    ps0 = _counters(summary, "ps/0")
    assert ps0["learner/0/updates"] > 0
    # Evaluations of 2 whole 50-step episodes reached PS shard 0 and the progress line.
    assert ps0["eval_count"] >= 1 and ps0["eval_episodes"] == 2, ps0
    assert -50 * 16.3 <= ps0["eval_return_mean"] <= 0
    assert "| eval " in run.output()
    assert (run.run_dir / "checkpoints" / "best.npz").exists()
    if algorithm == "td3":  # the actor is updated every policy_delay (2) critic updates
        critic, actor = ps0["learner/critic_updates"], ps0["learner/actor_updates"]
        assert actor == critic // 2, (actor, critic)
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_actor_killed_is_restarted(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        *one_each(2),
    )

    def actor1_reported():
        metrics = run.metrics()
        return metrics if metrics and metrics[-1].get("actor/1/env_steps", 0) > 0 else None

    run.poll_until(actor1_reported, 120, "actor 1 reporting env steps")
    run.signal_role("actor", 1, signal.SIGKILL)
    kill_lines = len(run.metrics())
    at_kill = run.metrics()[kill_lines - 1]

    # Line kill_lines is written after the kill; the snapshot of the line after it was
    # taken after that write, so it holds nothing the killed actor could still report.
    after_kill = run.poll_until(
        lambda: run.metrics()[kill_lines + 1] if len(run.metrics()) > kill_lines + 1 else None,
        30,
        "metrics after the kill",
    )

    def trained_on():
        """The restart on the console, and the run (actor 1 too) stepping and updating
        past both snapshots."""
        output, metrics = run.output(), run.metrics()
        if not re.search(r"actor-1 exited with code -9; restarting it", output):
            return None
        if not re.search(r"restarts [1-9]", output):
            return None
        last = metrics[-1]
        done = all(last[k] > max(at_kill[k], after_kill[k]) for k in ("env_steps", "updates"))
        return done and last["actor/1/env_steps"] > after_kill["actor/1/env_steps"]

    run.poll_until(trained_on, 120, "actor 1 restarted and the run training on")
    summary = run.interrupt()
    assert summary["restarts"]["actor-1"] >= 1, summary["restarts"]
    assert summary["restarts"]["actor-0"] == 0, summary["restarts"]
    assert _role_pids(run.config_path, "actor", 1) == []

    last = run.metrics()[-1]
    assert last["env_steps"] > at_kill["env_steps"]
    assert last["updates"] > at_kill["updates"]
    assert last["env_steps"] > after_kill["env_steps"]
    assert last["updates"] > after_kill["updates"]
    # Only the restarted actor 1 can have added to its counter after `after_kill`.
    assert (
        last["actor/1/env_steps"] > after_kill["actor/1/env_steps"] >= at_kill["actor/1/env_steps"]
    ), (at_kill, after_kill, last)
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_learner_killed_is_restarted_and_updates_keep_rising(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        "cluster.actor=2",
    )

    def learner_updated():
        metrics = run.metrics()
        return metrics if metrics and metrics[-1].get("learner/0/updates", 0) >= 40 else None

    run.poll_until(learner_updated, 120, "learner 0 reporting updates")
    run.signal_role("learner", 0, signal.SIGKILL)
    at_kill = run.metrics()[-1]
    run.poll_until(
        lambda: re.search(r"learner-0 exited with code -9; restarting it", run.output()),
        60,
        "the learner's restart",
    )
    # Written after the launcher saw the learner dead: it holds every report the killed
    # learner made, so what comes on top of it comes from the restarted one.
    lines = len(run.metrics())
    dead = run.poll_until(
        lambda: run.metrics()[lines] if len(run.metrics()) > lines else None,
        30,
        "metrics after the restart",
    )

    def updated_again():
        last = run.metrics()[-1]
        return all(last[k] > dead[k] for k in ("learner/0/updates", "ps/0/version"))

    run.poll_until(updated_again, 120, "updates of the restarted learner")
    summary = run.interrupt()
    assert summary["restarts"]["learner-0"] >= 1, summary["restarts"]
    last = run.metrics()[-1]
    # The restarted learner pulled the newest weights (the PS kept the optimizer state)
    # and its update counter kept rising; the PS version only moves forward.
    assert last["learner/0/updates"] > at_kill["learner/0/updates"], (at_kill, last)
    assert last["ps/0/version"] > at_kill["ps/0/version"]
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_ps_killed_is_restarted_from_its_checkpoint(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        "run.checkpoint_interval_s=1",
        "cluster.actor=2",
    )
    checkpoint = run.run_dir / "checkpoints" / "ps-0.npz"

    def trained_and_checkpointed():
        metrics = run.metrics()
        return checkpoint.exists() and metrics and metrics[-1].get("updates", 0) >= 40

    run.poll_until(trained_and_checkpointed, 120, "updates and a PS checkpoint")
    with np.load(checkpoint) as data:
        saved_version = json.loads(data["meta"].tobytes())["version"]
    run.signal_role("ps", 0, signal.SIGKILL)
    killed_at = len(run.metrics())

    def restored_status():
        for line in run.metrics()[killed_at:]:
            if "ps/0/version" in line:
                return line
        return None

    # The restarted shard restores its newest checkpoint: never older than what was read.
    first = run.poll_until(restored_status, 60, "metrics from the restarted PS shard")
    assert first["ps/0/version"] >= saved_version, (first["ps/0/version"], saved_version)

    def trained_on():
        """The restart on the console; steps, updates and pushes after the restored ones."""
        if not re.search(r"ps-0 exited with code -9; restarting it", run.output()):
            return None
        last = run.metrics()[-1]
        return all(last[k] > first[k] for k in ("updates", "env_steps", "ps/0/version"))

    run.poll_until(trained_on, 120, "training on the restored weights")
    summary = run.interrupt()
    assert summary["restarts"]["ps-0"] >= 1, summary["restarts"]
    last = run.metrics()[-1]
    # The learner and actors reconnected and kept training on the restored weights.
    assert last["updates"] > first["updates"] and last["env_steps"] > first["env_steps"]
    assert last["ps/0/version"] > first["ps/0/version"]
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_memory_killed_is_restarted_from_its_snapshot(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        "run.checkpoint_interval_s=3",
        "cluster.actor=2",
    )
    snapshot = run.run_dir / "checkpoints" / "memory-0.npz"

    def snapshot_counts() -> tuple[int, int]:
        """(items held, items ever inserted) of the snapshot on disk."""
        if not snapshot.exists():
            return 0, 0
        with np.load(snapshot) as data:  # written then renamed: always whole
            return min(int(data["inserted"]), int(data["capacity"])), int(data["inserted"])

    def snapshot_items() -> int:
        return snapshot_counts()[0]

    def trained_and_snapshotted():
        metrics = run.metrics()
        return snapshot_items() >= 500 and metrics and metrics[-1].get("updates", 0) >= 20

    run.poll_until(trained_and_snapshotted, 120, "updates and a non-empty memory snapshot")
    run.signal_role("memory", 0, signal.SIGKILL)
    # Read after the kill: the dead shard cannot write a newer one, and the restarted one
    # restores this file before it writes its first snapshot (3 s later).
    held, inserted = snapshot_counts()
    updates_at_kill = run.metrics()[-1]["updates"]

    # A newer snapshot comes from the restarted shard, 3 s or more after it started serving:
    # by then the learner has long used up (and reported) the batches it held at the kill,
    # so updates past that point were trained on samples of the restarted shard (which
    # samples only after it took `min_size_to_sample` inserts of its own).
    run.poll_until(
        lambda: snapshot_counts()[1] > inserted, 120, "a snapshot of the restarted memory shard"
    )
    updates_since = run.metrics()[-1]["updates"]
    run.poll_until(
        lambda: run.metrics()[-1]["updates"] > updates_since, 60, "updates after the restart"
    )
    summary = run.interrupt()
    output = run.output()
    assert re.search(r"memory-0 exited with code -9; restarting it", output), output
    assert summary["restarts"]["memory-0"] >= 1, summary["restarts"]
    memory = _counters(summary, "memory/0")
    # The restarted shard came back with exactly what its last snapshot held.
    assert held > 0 and memory["memory/0/restored_items"] == held, (held, memory)
    # ... then replayed what its write-ahead log held past the snapshot: it counts every
    # insert it had acknowledged (what the chaos soak sums).
    replayed = memory["memory/0/wal_replayed_items"]
    assert memory["memory/0/restored_inserted"] == inserted + replayed, (inserted, memory)
    assert memory["memory/0/inserted"] >= inserted
    assert memory["memory/0/inserts"] > 0 and memory["memory/0/samples"] > 0
    assert run.metrics()[-1]["updates"] > updates_at_kill
    assert snapshot_items() >= held  # the clean shutdown wrote a final snapshot
    _assert_no_processes_left(run.run_dir)
    assert not _segments() - run.segments_before, _segments() - run.segments_before


def _exited(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie its parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_sigterm_makes_every_role_save_what_it_owns_and_exit_within_10s(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        "run.checkpoint_interval_s=1000",  # only SIGTERM makes the servers write
        "cluster.actor=2",
        "cluster.evaluator=1",
        "eval.interval_s=1",
        "eval.episodes=2",
    )
    checkpoints = run.run_dir / "checkpoints"
    run.poll_until(
        lambda: (run.metrics() or [{}])[-1].get("updates", 0) >= 20, 120, "learner updates"
    )
    saved = {"ps": checkpoints / "ps-0.npz", "memory": checkpoints / "memory-0.npz"}
    for role, task in (("actor", 1), ("evaluator", 0), ("learner", 0), ("memory", 0), ("ps", 0)):
        sent = time.time()
        pid = run.signal_role(role, task, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while not _exited(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.time() - sent
        assert _exited(pid), f"{role}-{task} still running 10 s after SIGTERM:\n{run.logs()}"
        if role in saved:  # a listening role checkpoints what it owns on the way out
            path = saved[role]
            assert path.exists() and path.stat().st_mtime >= sent - 0.01, (role, path)
        print(f"{role}-{task} exited {took:.2f} s after SIGTERM")
        if role == "memory":
            with np.load(saved["memory"]) as data:
                held = min(int(data["inserted"]), int(data["capacity"]))

    # The servers are restarted (a worker that exits 0 is not: Kubernetes restarts those);
    # the memory shard took back exactly what its SIGTERM snapshot held.
    def listening_again(role: str, name: str) -> bool:
        log = (run.run_dir / "logs" / f"{role}-0.log").read_text()
        return log.count(f"{name} 0 listening on") >= 2

    def both_restarted():
        output = run.output()
        return (
            re.search(r"memory-0 exited with code 0; restarting it", output)
            and re.search(r"ps-0 exited with code 0; restarting it", output)
            and listening_again("memory", "memory shard")
            and listening_again("ps", "PS shard")
        )

    run.poll_until(both_restarted, 120, "the PS and memory shards restarted and listening")
    memory = _counters(run.interrupt(), "memory/0")
    assert held > 0 and memory["memory/0/restored_items"] == held, (held, memory)
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_aggregate_memory_killed_mid_round_the_round_is_redone(launch):
    config, overrides = ROUNDS["ppo"]
    run = launch(
        *overrides,
        "stop.max_env_steps=null",
        "stop.max_seconds=200",  # a backstop: the test interrupts the run once it saw enough
        "env.num_envs=4",
        config=config,
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )

    def round_at_least(n):
        return lambda: (run.metrics() or [{}])[-1].get("learner/round", 0) >= n

    run.poll_until(round_at_least(3), 120, "three rounds")
    run.signal_role("memory", 0, signal.SIGKILL)
    run.poll_until(
        lambda: re.search(r"memory-0 exited with code -9; restarting it", run.output()),
        60,
        "the memory shard's restart",
    )

    # The restarted shard lost the items shipped before the kill: the learner abandons
    # that round (publishes the next one with the same weights) instead of waiting forever.
    def abandoned():
        last = (run.metrics() or [{}])[-1]
        return last if last.get("learner/abandoned_rounds", 0) >= 1 else None

    redone = run.poll_until(abandoned, 120, "the lost round abandoned")["learner/round"]
    run.poll_until(round_at_least(redone + 3), 120, "rounds after the memory restart")
    run.interrupt()
    last = run.metrics()[-1]
    assert last["learner/abandoned_rounds"] >= 1, last
    assert "round" in (run.run_dir / "logs" / "learner-0.log").read_text()
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_bad_config_fails_before_start(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "easyrl.cli",
            "train",
            str(CONFIG),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            "replay.capacty=5",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=50,
    )
    assert result.returncode == 2, result
    assert "did you mean 'replay.capacity'" in result.stderr, result.stderr
    assert "run directory" not in result.stdout
    assert not run_dir.exists()
    assert list(tmp_path.iterdir()) == []  # no default runs/ directory either
    assert _processes_referencing(str(run_dir)) == {}


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_ctrl_c_leaves_no_orphans(launch):
    run = launch(
        "stop.max_env_steps=null",
        "stop.max_seconds=60",
        *one_each(2),
    )
    run.poll_until(lambda: "env steps" in run.output(), 90, "the first progress line")
    assert _role_pids(run.config_path, "ps", 0), "PS shard 0 is not running"
    interrupted = time.monotonic()
    run.process.send_signal(signal.SIGINT)
    code = run.wait(60)
    took = time.monotonic() - interrupted
    output = run.output()
    assert code == 130, f"exit code {code}:\n{output}"
    assert took < 35, f"launcher took {took:.1f}s to stop after SIGINT"
    assert "interrupted" in output
    summary = run.summary()
    assert summary["reason"] == "interrupted"
    assert summary["exit_code"] == 130
    _assert_no_processes_left(run.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(90)
def test_run_role_needs_token(tmp_path):
    env = _env()
    assert "EASYRL_TOKEN" not in env
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "easyrl.cli",
            "run",
            "--role",
            "ps",
            "--task",
            "0",
            "--config",
            str(CONFIG),
            "--ps-hosts",
            f"127.0.0.1:{_free_port()}",
            "--memory-hosts",
            f"127.0.0.1:{_free_port()}",
            "--num-learners",
            "1",
            "--num-actors",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=80,
    )
    assert result.returncode == 2, result
    assert "no auth token" in result.stderr, result.stderr
    assert "EASYRL_TOKEN" in result.stderr
    assert "security.token_file" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (no run dir, no checkpoint)


def test_children_keep_large_buffers_in_the_heap(tmp_path, monkeypatch):
    """Every role gets glibc settings that keep freed multi-MB message buffers in the heap,
    unless the user set them (theirs win)."""
    from easyrl import config as config_lib
    from easyrl.cluster.launcher import MALLOC_ENV, LocalCluster

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    raw = {
        "algorithm": {"name": "dqn"},
        "env": {"id": "CartPole-v1"},
        "run": {"dir": str(tmp_path)},
    }
    cfg = config_lib.from_dict(raw)
    env = LocalCluster(cfg, "token")._env("memory")
    assert env["MALLOC_MMAP_THRESHOLD_"] == MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]
    assert env["MALLOC_TRIM_THRESHOLD_"] == "12345"


@pytest.mark.cluster
def test_a_memory_shard_process_serves_without_tensorflow(tmp_path):
    """`easyrl run --role memory` never imports TensorFlow (a memory shard does not use it:
    seconds of CPU less per shard at start-up), and serves."""
    from easyrl.cluster.launcher import free_ports
    from easyrl.transport import easyrl_pb2 as pb
    from easyrl.transport import rpc

    raw = yaml.safe_load((ROOT / "configs" / "cartpole_apex.yaml").read_text())
    raw["run"] = {**raw.get("run", {}), "dir": str(tmp_path / "run")}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    ps_port, memory_port = free_ports("127.0.0.1", 2)
    token = "memory-without-tf-token-0123456789"
    command = [
        *[sys.executable, "-m", "easyrl.cli", "run", "--role", "memory", "--task", "0"],
        *["--config", str(config), "--ps-hosts", f"127.0.0.1:{ps_port}"],
        *["--memory-hosts", f"127.0.0.1:{memory_port}"],
    ]
    env = {**_env(), rpc.TOKEN_ENV: token}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{memory_port}"
        client = rpc.Client(rpc.stub_class("memory"), address, token, timeout_s=5, retry_s=60)
        reply = client.call("Status", pb.StatusRequest())
        assert reply.role == "memory", reply
        libraries = Path(f"/proc/{process.pid}/maps").read_text()
        assert "tensorflow" not in libraries
        client.close()
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode(errors="replace")
    assert "Traceback" not in output, output
