"""Runs a user can trust: a run directory belongs to one run, resuming is explicit and keeps
one clock, crashes are explained, bad env ids fail before start-up, a bare PS shard 0 logs
progress, and every command example in the docs loads.

Real `easyrl train` launchers and role processes (helpers from test_cluster.py).
"""

import hashlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cluster import BASE_OVERRIDES, CONFIG, ROOT, _env, _read_jsonl

from easyrl import api
from easyrl.errors import ConfigError

SMALL = (*BASE_OVERRIDES, "cluster.actor=1")


def _train(args: list[str], cwd: Path, out: Path) -> subprocess.Popen:
    """`easyrl train ARGS` in the background, its output (stdout and stderr) into `out`."""
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "easyrl.cli", "train", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=_env(),
        )


def _train_fails_fast(args: list[str], cwd: Path) -> str:
    """Runs `easyrl train ARGS`, which must fail within 10 s; returns its stderr."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "easyrl.cli", "train", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=60,
    )
    assert time.monotonic() - started < 10 and done.returncode != 0, done.stderr
    return done.stderr


def _sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def _files(directory: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory`."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _finish(process: subprocess.Popen, out: Path, timeout_s: float) -> str:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"easyrl train still running after {timeout_s:.0f}s:\n{out.read_text()}")
    return out.read_text(errors="replace")


@pytest.fixture(scope="module")
def apex_run(tmp_path_factory) -> Path:
    """An Ape-X DQN run stopped after a few updates (its directory)."""
    tmp = tmp_path_factory.mktemp("apex")
    run_dir = tmp / "run"
    out = tmp / "train.out"
    process = _train(
        [str(CONFIG), *_sets(*SMALL, "stop.max_env_steps=1500", f"run.dir={run_dir}")], tmp, out
    )
    text = _finish(process, out, 180)
    assert process.returncode == 0, text
    return run_dir


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_new_run_in_a_directory_holding_another_fails_and_changes_nothing(apex_run, tmp_path):
    before = _files(apex_run)
    ppo = str(ROOT / "configs" / "cartpole_ppo.yaml")
    error = _train_fails_fast([ppo, *_sets(f"run.dir={apex_run}")], tmp_path)
    assert "holds another run (algorithm.name 'dqn' there, 'ppo' here" in error
    assert f"easyrl train --resume {apex_run}" in error
    assert _files(apex_run) == before


@pytest.mark.cluster
def test_resuming_a_run_past_its_budget_says_which_key_to_raise(apex_run):
    import easyrl
    from easyrl.cluster import rundir

    before = _files(apex_run)
    # It stopped at stop.max_env_steps=1500: resumed as it is, it would stop at once.
    with pytest.raises(
        ConfigError, match=r"past stop.max_env_steps=1500: .*--set stop.max_env_steps="
    ):
        easyrl.train(resume=apex_run)
    assert _files(apex_run) == before  # refused before anything started or was recorded
    cfg = rundir.load_resumed(apex_run, ["stop.max_env_steps=100000"])
    rundir.check_budget_left(cfg, rundir.resume_state(apex_run))  # raised: accepted


@pytest.mark.cluster
def test_resuming_refuses_overrides_that_shape_the_checkpoints(apex_run):
    from easyrl.cluster import rundir

    with pytest.raises(ConfigError, match="--resume: model.hidden cannot change when resuming"):
        rundir.load_resumed(apex_run, ["model.hidden=[8]"])
    # Integer hyper-parameters shape the replay items (n-step, batch, unroll): refused too.
    with pytest.raises(ConfigError, match="algorithm.n_step cannot change when resuming"):
        rundir.load_resumed(apex_run, ["algorithm.n_step=5"])
    cfg = rundir.load_resumed(apex_run, ["stop.max_seconds=99", "algorithm.lr=0.0002"])
    assert cfg.stop.max_seconds == 99 and cfg.run.dir == str(apex_run.resolve())
    assert cfg.algorithm.params.lr == 0.0002


def _console_clock(text: str) -> list[float]:
    """The elapsed seconds of every progress line, in order."""
    return [float(m) for m in re.findall(r"^\[\s*([\d.]+)s\] env steps", text, re.M)]


@pytest.mark.cluster
def test_a_resumes_overrides_hold_for_later_resumes_and_the_stop_conditions_are_said(
    apex_run, tmp_path
):
    from easyrl.cluster import rundir

    run_dir = tmp_path / "run"
    shutil.copytree(apex_run, run_dir)
    rundir.record_resume(run_dir, ["stop.max_env_steps=9000", "algorithm.lr=0.0002"], 3.0)
    cfg = rundir.load_resumed(run_dir)  # the next resume, without --set
    assert cfg.stop.max_env_steps == 9000 and cfg.algorithm.params.lr == 0.0002
    cfg = rundir.load_resumed(run_dir, ["stop.max_env_steps=12000"])  # a later value wins
    assert cfg.stop.max_env_steps == 12000 and cfg.algorithm.params.lr == 0.0002
    text = rundir.describe_resume(
        run_dir, cfg, rundir.resume_state(run_dir), ["stop.max_env_steps=12000"]
    )
    assert "overrides kept from earlier resumes (resumes.yaml): stop.max_env_steps=9000 " in text
    assert "overrides of this resume: stop.max_env_steps=12000" in text
    assert text.endswith(
        "stop conditions (the first met stops the run): stop.max_env_steps=12000, "
        f"stop.max_seconds={cfg.stop.max_seconds:g}"
    )


@pytest.mark.cluster
@pytest.mark.timeout(360)
def test_an_interrupted_run_resumes_its_counters_replay_and_clock(tmp_path):
    from easyrl.cluster import rundir

    run_dir = tmp_path / "run"
    first_out = tmp_path / "first.out"
    overrides = (
        *SMALL,
        "stop.max_seconds=300",
        "run.checkpoint_interval_s=1",
        f"run.dir={run_dir}",
    )
    first = _train([str(CONFIG), *_sets(*overrides)], tmp_path, first_out)
    deadline = time.monotonic() + 150
    while not any(r.get("updates", 0) > 50 for r in _read_jsonl(run_dir / "metrics.jsonl")):
        assert first.poll() is None and time.monotonic() < deadline, first_out.read_text()
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    first_text = _finish(first, first_out, 60)
    assert first.returncode == 130, first_text
    before = _read_jsonl(run_dir / "metrics.jsonl")
    # The run clock is what PS shard 0 checkpointed last, in summary.json and the final line.
    checkpointed = rundir.checkpointed_clock(run_dir)
    # metrics.jsonl rounds time_s to the millisecond: a row written at the checkpoint's
    # instant may read up to 0.5 ms later than the clock it was taken from.
    assert checkpointed is not None and round(checkpointed, 3) >= before[-1]["time_s"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["elapsed_s"] == round(checkpointed, 2), (summary, checkpointed)
    assert f"stopped after {checkpointed:.1f}s: interrupted" in first_text, first_text
    config_before = (run_dir / "config.yaml").read_bytes()
    # The resumed run trains ~10 s more on the same clock (its actors step within ~3 s of
    # its PS shard's start); rounded as the override carries it.
    stop_at = round(before[-1]["time_s"] + 10, 1)

    out = tmp_path / "resumed.out"
    resumed = _train(
        ["--resume", str(run_dir), *_sets(f"stop.max_seconds={stop_at:.1f}")], tmp_path, out
    )
    text = _finish(resumed, out, 150)
    assert resumed.returncode == 0, text
    line = re.search(r"resuming (\S+): version (\d+), env steps ([\d,]+), replay ([\d,]+)", text)
    assert line and line.group(1) == str(run_dir.resolve()), text
    assert int(line.group(2)) > 0 and int(line.group(3).replace(",", "")) > 0
    # The resumed clock starts at exactly the checkpointed one.
    assert f"run clock {checkpointed:.2f} s\n" in text, text
    ps_log = (run_dir / "logs" / "ps-0.log").read_text()
    assert f"and run clock {checkpointed:.2f} s from" in ps_log
    assert f"stop conditions (the first met stops the run): stop.max_seconds={stop_at:g}" in text
    assert (run_dir / "config.yaml").read_bytes() == config_before  # the run's own config
    records = _read_jsonl(run_dir / "metrics.jsonl")
    steps = [r["env_steps"] for r in records]
    times = [r["time_s"] for r in records]
    assert steps == sorted(steps) and times == sorted(times)  # never backwards
    assert records[-1]["env_steps"] > before[-1]["env_steps"]
    # One clock: the console's progress lines, metrics.jsonl and the stop condition.
    clock = _console_clock(text)
    assert clock and clock[0] >= before[-1]["time_s"] - 0.5, (clock, before[-1]["time_s"])
    stopped = float(re.search(r"stopped after ([\d.]+)s: max_seconds reached", text).group(1))
    stop = next(r for r in records if "stop" in r)  # the record of the stop condition
    assert abs(stopped - stop["time_s"]) <= 1.0, (stopped, stop["time_s"])
    assert stop_at <= stop["time_s"] <= stop_at + 1.0, (stop_at, stop["time_s"])
    # The next resume keeps this resume's stop.max_seconds, so it is refused as spent.
    assert rundir.load_resumed(run_dir).stop.max_seconds == stop_at
    with pytest.raises(ConfigError, match=f"past stop.max_seconds={stop_at:g}"):
        rundir.check_budget_left(rundir.load_resumed(run_dir), rundir.resume_state(run_dir))


CRASHING_ENV = '''
import gymnasium as gym
import numpy as np


class Crashing(gym.Env):
    """CartPole-sized, with a bug: it raises at its 300th step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps >= 300:
            raise KeyError("lost the ball at step 300")
        return np.zeros(4, np.float32), 1.0, False, self.steps % 50 == 0, {}
'''


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_deterministic_crash_is_explained_and_ends_the_run(tmp_path):
    (tmp_path / "crashing_env.py").write_text(CRASHING_ENV)
    out = tmp_path / "train.out"
    overrides = (*SMALL, "env.id=crashing_env:Crashing", "stop.max_seconds=240")
    process = _train(
        [str(CONFIG), *_sets(*overrides, f"run.dir={tmp_path / 'run'}")], tmp_path, out
    )
    text = _finish(process, out, 240)
    assert process.returncode not in (0, None), text
    assert "KeyError: 'lost the ball at step 300'" in text
    assert str(tmp_path / "run" / "logs" / "actor-0.log") in text
    final = text.strip().splitlines()[-1]
    assert "crashed 3 times with the same error" in final and "2 restarts" in final, final
    crashes = [
        float(t) for t in re.findall(r"^\[\s*([\d.]+)s\] actor-0 exited with code 1", text, re.M)
    ]
    assert len(crashes) == 3, text
    ended = float(re.search(r"stopped after ([\d.]+)s", text).group(1))
    assert ended - crashes[-1] < 60


@pytest.mark.cluster
def test_a_mistyped_env_id_fails_before_any_process_starts(tmp_path):
    run_dir = tmp_path / "run"
    error = _train_fails_fast(
        [str(CONFIG), *_sets("env.id=CartPol-v1", f"run.dir={run_dir}")], tmp_path
    )
    assert "did you mean 'CartPole-v1'" in error
    assert not run_dir.exists()


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_bare_ps_shard_zero_logs_progress_at_the_log_interval(tmp_path):
    ps, memory = _free_ports(2)
    env = {**_env(), "EASYRL_TOKEN": "t" * 32}
    command = [sys.executable, "-m", "easyrl.cli", "run", "--role", "ps", "--task", "0"]
    command += ["--config", str(CONFIG), "--ps-hosts", f"127.0.0.1:{ps}"]
    command += ["--memory-hosts", f"127.0.0.1:{memory}", "--num-learners", "1", "--num-actors", "1"]
    command += _sets("run.log_interval_s=0.5", f"run.dir={tmp_path / 'run'}")
    log = tmp_path / "ps.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 90
        while len(re.findall(r"ps-0 INFO .*\] env steps", log.read_text())) < 4:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    stamps = re.findall(r"ps-0 INFO .*\[\s*([\d.]+)s\] env steps", log.read_text())
    gaps = [b - a for a, b in zip(map(float, stamps), map(float, stamps[1:]))]
    assert gaps and all(0.3 <= g <= 1.5 for g in gaps), stamps


# --- every command example in the docs loads ---------------------------------------------

DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("examples/*/*.md")),
]
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))
TRAIN = re.compile(r"easyrl (?:train|k8s) (\S+\.yaml)((?:\s+--set\s+\S+=\S+)*)")
SET = re.compile(r"--set\s+([\w.]+=[^\s`'\")]+)")
PLACEHOLDER = re.compile(r"^(dotted\.key|section\.key|(\w+\.)?K)=|[<>]|\.\.\.|=(PATH|DIR|N)$")


def _examples() -> list[tuple[str, str, list[str], str]]:
    """(where, config file, overrides) of every `easyrl train|k8s CONFIG --set ...` in the
    docs and the scripts' --help, and (where, "", [override]) for every lone `--set`, each
    with the text it stands in."""
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in DOCS]
    for script in SCRIPTS:
        done = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
        texts.append((f"{script.name} --help", done.stdout + done.stderr))
    found = []
    for where, text in texts:
        for match in TRAIN.finditer(text):
            found.append((where, match.group(1), SET.findall(match.group(2)), text))
        for match in SET.finditer(TRAIN.sub("", text)):
            found.append((where, "", [match.group(1)], text))
    return found


def test_every_command_example_in_the_docs_and_scripts_loads():
    configs = sorted((ROOT / "configs").glob("*.yaml"))
    examples = _examples()
    assert len(examples) > 20, examples
    failures = []
    for where, config, overrides, text in examples:
        overrides = [o for o in overrides if not PLACEHOLDER.search(o)]
        candidates = [ROOT / config] if config else configs
        if config and not (ROOT / config).exists():
            if not config.startswith(("configs/", "examples/")):
                continue  # a user's own file named in prose (my_config.yaml)
            failures.append(f"{where}: {config} does not exist")
            continue
        errors = []
        for path in candidates:
            try:
                api.load_config(path, set=overrides)  # as `easyrl train` loads it
                break
            except ConfigError as err:
                if "record one first" in str(err):  # an offline config before its recording
                    break
                if str(err)[:40] in text:  # an example of a bad command, shown with its error
                    break
                errors.append(str(err))
        else:
            failures.append(f"{where}: {config or 'any config'} {overrides}: {errors[0]}")
    assert not failures, "\n".join(failures)
