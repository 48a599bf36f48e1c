"""Tests for the bash launchers in scripts/ (fast, no real easyrl, no real ssh).

easyrl, ssh and scp are replaced through EASYRL_BIN, SSH and SCP by small fake scripts
that only record what they were given.
"""

import os
import re
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from easyrl.cluster.launcher import MALLOC_ENV

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
LAUNCH_ROLE = SCRIPTS / "launch_role.sh"
LAUNCH_CLUSTER = SCRIPTS / "launch_cluster.sh"
STOP_CLUSTER = SCRIPTS / "stop_cluster.sh"
ALL_SCRIPTS = [LAUNCH_ROLE, LAUNCH_CLUSTER, STOP_CLUSTER]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")

PS = "10.0.0.1:7000,10.0.0.2:7000"
MEM = "10.0.0.1:7001,10.0.0.2:7001"
LEARNERS = "10.0.0.3"
ACTORS = "10.0.0.4,10.0.0.5,10.0.0.6"
TOKEN = "s3cr3t-t0ken-value-0123456789abcdef"
SEP, END = "\x1f", "\x1e"  # fakes record argv fields / calls with these separators


def _env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"EASYRL_TOKEN", "TF_CPP_MIN_LOG_LEVEL", "EASYRL_BIN", "SSH", "SCP"}
    }
    env["EASYRL_STARTUP_DELAY"] = "0"
    env.update(extra)
    return env


def _run(script, *args, cwd=None, **env):
    return subprocess.run(
        ["bash", str(script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(**env),
        timeout=20,
    )


def _executable(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _malloc_line(trim: str | None = None) -> str:
    """What the fake easyrl prints of the glibc settings: the launcher's (`MALLOC_ENV`), with a
    user's own trim threshold where given."""
    trim = MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"] if trim is None else trim
    return f"MALLOC={MALLOC_ENV['MALLOC_MMAP_THRESHOLD_']}/{trim}/{MALLOC_ENV['MALLOC_ARENA_MAX']}"


def _fake_easyrl(tmp_path):
    return _executable(
        tmp_path / "fake_easyrl",
        'for a in "$@"; do echo "ARG=$a"; done\n'
        'echo "TOKEN=${EASYRL_TOKEN-<unset>}"\n'
        'echo "TF=${TF_CPP_MIN_LOG_LEVEL-<unset>}"\n'
        'echo "MALLOC=${MALLOC_MMAP_THRESHOLD_-<unset>}/${MALLOC_TRIM_THRESHOLD_-<unset>}'
        '/${MALLOC_ARENA_MAX-<unset>}"\n',
    )


def _recorder(path: Path, record: Path) -> Path:
    """A fake ssh/scp: appends its argv to `record`, runs nothing."""
    return _executable(
        path, f"{{ printf '%s{SEP}' \"$@\"; printf '{END}'; }} >> {shlex.quote(str(record))}\n"
    )


def _calls(record: Path):
    if not record.exists():
        return []
    return [call.split(SEP)[:-1] for call in record.read_text().split(END)[:-1]]


def _config(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("algorithm: dqn\n")
    return cfg


def _token_file(tmp_path):
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    return tok


def _launched(remote_cmd: str):
    """(role, task) from the remote command launch_cluster.sh builds."""
    words = shlex.split(remote_cmd)
    i = words.index("scripts/launch_role.sh")
    return words[i + 1], int(words[i + 2]), words


def _expected_order():
    return (
        [("ps", i, h.split(":")[0]) for i, h in enumerate(PS.split(","))]
        + [("memory", i, h.split(":")[0]) for i, h in enumerate(MEM.split(","))]
        + [("learner", i, h) for i, h in enumerate(LEARNERS.split(","))]
        + [("actor", i, h) for i, h in enumerate(ACTORS.split(","))]
    )


def _cluster_args(cfg, workdir, *extra):
    hosts = (
        f"--ps_hosts {PS} --memory_hosts {MEM} --learner_hosts {LEARNERS} --actor_hosts {ACTORS}"
    )
    return [cfg.name, *hosts.split(), "--workdir", workdir, *extra]


# --- all scripts ------------------------------------------------------------------------


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: p.name)
def test_syntax_and_help(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    res = _run(script, "--help")
    assert res.returncode == 0
    assert f"Usage: scripts/{script.name}" in res.stdout


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: p.name)
def test_unknown_option_is_misuse(script):
    res = _run(script, "--no-such-flag")
    assert res.returncode == 2
    assert "unknown option: --no-such-flag" in res.stderr


# --- launch_role.sh ---------------------------------------------------------------------


def test_launch_role_execs_easyrl_with_env_token(tmp_path):
    cfg, tok = _config(tmp_path), _token_file(tmp_path)
    res = _run(
        LAUNCH_ROLE,
        *("memory", "1", cfg),
        *f"--ps_hosts {PS} --memory_hosts {MEM} --num_learners 2 --num_actors 4".split(),
        *("--token_file", tok),
        EASYRL_BIN=_fake_easyrl(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    argv = [ln[4:] for ln in lines if ln.startswith("ARG=")]
    expected = f"run --role memory --task 1 --config {cfg} --ps-hosts {PS} --memory-hosts {MEM}"
    assert argv == [*expected.split(), "--num-learners", "2", "--num-actors", "4"]
    assert f"TOKEN={TOKEN}" in lines  # from the file, whitespace stripped
    assert "TF=2" in lines
    assert _malloc_line() in lines  # the launcher's glibc settings
    assert not any(TOKEN in a for a in argv)


def test_launch_role_dash_spellings_extra_args_and_env_passthrough(tmp_path):
    cfg = _config(tmp_path)
    res = _run(
        LAUNCH_ROLE,
        *("ps", "0", cfg),
        *"--ps-hosts=h:1 --num-actors 1 -- --set train.lr=0.1".split(),
        EASYRL_BIN=_fake_easyrl(tmp_path),
        EASYRL_TOKEN="from-env",
        TF_CPP_MIN_LOG_LEVEL="0",
        MALLOC_TRIM_THRESHOLD_="5",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    argv = [ln[4:] for ln in lines if ln.startswith("ARG=")]
    assert argv[-6:] == "--ps-hosts h:1 --num-actors 1 --set train.lr=0.1".split()
    assert "TOKEN=from-env" in lines  # environment left as is without --token_file
    assert "TF=0" in lines  # an existing TF_CPP_MIN_LOG_LEVEL wins
    assert _malloc_line(trim="5") in lines  # so does a user's malloc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trainer", "0"], "unknown ROLE 'trainer'"),
        (["actor", "-1"], "TASK must be a non-negative integer, got '-1'"),
        (["actor", "one"], "TASK must be a non-negative integer, got 'one'"),
        (["actor", "1.5"], "TASK must be a non-negative integer"),
        (["ps", "2", "--ps_hosts", PS], "TASK 2 is out of range"),
        (["actor", "0", "--ps_hosts", "nohostport"], "host:port list"),
        (["actor", "0", "--num_actors", "x"], "non-negative integer"),
        (["actor", "0", "--token_file", "/nonexistent/token"], "token file not readable"),
    ],
)
def test_launch_role_misuse_exits_2(tmp_path, args, message):
    cfg = _config(tmp_path)
    res = _run(LAUNCH_ROLE, *args[:2], cfg, *args[2:], EASYRL_BIN=_fake_easyrl(tmp_path))
    assert res.returncode == 2
    assert message in res.stderr
    assert "ARG=" not in res.stdout


def test_launch_role_missing_config_or_arguments(tmp_path):
    fake = _fake_easyrl(tmp_path)
    res = _run(LAUNCH_ROLE, "learner", "0", tmp_path / "missing.yaml", EASYRL_BIN=fake)
    assert res.returncode == 2
    assert "config file not found" in res.stderr
    res = _run(LAUNCH_ROLE, "learner", "0", EASYRL_BIN=fake)
    assert res.returncode == 2
    assert "expected ROLE TASK CONFIG" in res.stderr


def test_launch_role_log_dir(tmp_path):
    cfg, tok = _config(tmp_path), _token_file(tmp_path)
    log_dir = tmp_path / "logs" / "nested"
    args = ("actor", "3", cfg, "--num_actors", "4", "--token_file", tok, "--log_dir", log_dir)
    res = _run(LAUNCH_ROLE, *args, EASYRL_BIN=_fake_easyrl(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == ""
    log = (log_dir / "actor-3.log").read_text()
    assert "ARG=actor" in log and f"TOKEN={TOKEN}" in log


# --- launch_cluster.sh ------------------------------------------------------------------


def test_launch_cluster_dry_run(tmp_path):
    cfg, tok = _config(tmp_path), _token_file(tmp_path)
    res = _run(
        LAUNCH_CLUSTER,
        *_cluster_args(cfg, tmp_path, "--token_file", tok, "--dry-run"),
        SSH=tmp_path / "must-not-run",
        SCP=tmp_path / "must-not-run",
    )
    assert res.returncode == 0, res.stderr
    assert TOKEN not in res.stdout + res.stderr
    commands = [shlex.split(ln) for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    assert len(commands) == 8  # one per process, no scp: the token file is the user's
    seen = []
    for cmd in commands:
        assert cmd[0].endswith("must-not-run") and len(cmd) == 3
        role, task, words = _launched(cmd[2])
        seen.append((role, task, cmd[1]))
        assert cmd[2].startswith(f"cd {tmp_path} && ")
        assert words[words.index("--token_file") + 1] == str(tok)
        assert words[words.index("--num_learners") + 1] == "1"
        assert words[words.index("--num_actors") + 1] == "3"
        assert words[words.index("--ps_hosts") + 1] == PS
        assert words[words.index("--memory_hosts") + 1] == MEM
        assert words[words.index("--log_dir") + 1] == "logs"
    assert seen == _expected_order()
    for role, task, host in seen:
        assert f"log: {host}:{tmp_path}/logs/{role}-{task}.log" in res.stderr
    assert not (tmp_path / ".easyrl_token").exists()


def test_launch_cluster_dry_run_local_hosts_and_generated_token(tmp_path):
    cfg = _config(tmp_path)
    hosts = "--ps_hosts localhost:7000 --memory_hosts 127.0.0.1:7001 --learner_hosts localhost"
    extra = "--actor_hosts node9,localhost --dry-run -- --set train.lr=0.5"
    res = _run(LAUNCH_CLUSTER, cfg.name, "--workdir", tmp_path, *hosts.split(), *extra.split())
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    token_path = f"{tmp_path}/.easyrl_token"
    # the generated token is copied only to the one remote host, before anything starts
    assert shlex.split(lines[0]) == ["scp", "-p", "-q", token_path, f"node9:{token_path}"]
    starts = [shlex.split(ln) for ln in lines[1:]]
    assert [c[:2] for c in starts] == [["bash", "-c"]] * 3 + [["ssh", "node9"], ["bash", "-c"]]
    for cmd in starts:
        words = _launched(cmd[-1])[2]
        assert words[words.index("--token_file") + 1] == token_path
        i = words.index("--log_dir")
        assert words[i + 2 : i + 5] == ["--", "--set", "train.lr=0.5"]
    assert not (tmp_path / ".easyrl_token").exists()  # dry run creates nothing


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ps_hosts", "10.0.0.1", "host:port"),
        ("--ps_hosts", "10.0.0.1:70x0", "host:port"),
        ("--ps_hosts", "10.0.0.1:7000,", "host:port"),
        ("--memory_hosts", "", "must not be empty"),
        ("--memory_hosts", "10.0.0.1:99999", "port out of range"),
        ("--memory_hosts", "10.0.0.1:7000", "listed twice"),
        ("--learner_hosts", "", "must not be empty"),
        ("--actor_hosts", "a,,b", "list of hosts"),
        ("--actor_hosts", "h:22", "list of hosts"),
        ("--workdir", "relative/dir", "absolute path"),
    ],
)
def test_launch_cluster_bad_input_exits_2(tmp_path, flag, value, message):
    cfg = _config(tmp_path)
    args = _cluster_args(cfg, tmp_path, "--dry-run")
    args[args.index(flag) + 1] = value
    res = _run(LAUNCH_CLUSTER, *args, SSH=tmp_path / "must-not-run")
    assert res.returncode == 2
    assert message in res.stderr
    assert res.stdout == ""


def test_launch_cluster_missing_config_or_list(tmp_path):
    _config(tmp_path)
    args = _cluster_args(Path("nope.yaml"), tmp_path, "--dry-run")
    res = _run(LAUNCH_CLUSTER, *args)
    assert res.returncode == 2 and "config file not found" in res.stderr
    args = _cluster_args(Path("exp.yaml"), tmp_path, "--dry-run")
    del args[args.index("--actor_hosts") : args.index("--actor_hosts") + 2]
    res = _run(LAUNCH_CLUSTER, *args)
    assert res.returncode == 2 and "--actor_hosts is required" in res.stderr


def test_launch_cluster_with_fake_ssh_and_scp(tmp_path):
    cfg, record = _config(tmp_path), tmp_path / "calls"
    ssh = _recorder(tmp_path / "fake_ssh", record)
    scp = _recorder(tmp_path / "fake_scp", record)
    res = _run(LAUNCH_CLUSTER, *_cluster_args(cfg, tmp_path), SSH=ssh, SCP=scp)
    assert res.returncode == 0, res.stderr

    token_file = tmp_path / ".easyrl_token"
    token = token_file.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

    calls = _calls(record)
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
    assert calls[:6] == [["-p", "-q", str(token_file), f"{h}:{token_file}"] for h in hosts]
    ssh_calls = calls[6:]
    assert len(ssh_calls) == 8
    assert [(*_launched(c[1])[:2], c[0]) for c in ssh_calls] == _expected_order()
    for c in ssh_calls:
        assert "nohup scripts/launch_role.sh" in c[1] and c[1].rstrip().endswith("& }")
    assert all(token not in arg for call in calls for arg in call)
    assert token not in res.stdout + res.stderr
    assert not (tmp_path / "logs").exists()  # nothing ran locally


def test_launch_cluster_local_hosts_really_start(tmp_path):
    """localhost entries run scripts/launch_role.sh locally (with a fake easyrl)."""
    cfg = _config(tmp_path)
    (tmp_path / "scripts").symlink_to(SCRIPTS)
    hosts = "--ps_hosts localhost:7000 --memory_hosts 127.0.0.1:7001"
    hosts += " --learner_hosts localhost --actor_hosts localhost"
    res = _run(
        LAUNCH_CLUSTER,
        *(cfg.name, "--workdir", tmp_path, *hosts.split()),
        EASYRL_BIN=_fake_easyrl(tmp_path),
        SSH=tmp_path / "no-ssh",
        SCP=tmp_path / "no-scp",
    )
    assert res.returncode == 0, res.stderr
    token = (tmp_path / ".easyrl_token").read_text().strip()
    logs = [tmp_path / "logs" / f"{r}-0.log" for r in ("ps", "memory", "learner", "actor")]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not all(
        p.exists() and "TF=" in p.read_text() for p in logs
    ):
        time.sleep(0.02)
    for path, role in zip(logs, ("ps", "memory", "learner", "actor")):
        text = path.read_text()
        assert f"ARG={role}" in text and f"TOKEN={token}" in text and "ARG=--num-actors" in text


# --- stop_cluster.sh --------------------------------------------------------------------


def test_stop_cluster_dry_run(tmp_path):
    hosts = f"--ps_hosts {PS} --memory_hosts {MEM} --learner_hosts localhost --actor_hosts {ACTORS}"
    res = _run(STOP_CLUSTER, "exp.yaml", *hosts.split(), "--dry-run", SSH=tmp_path / "must-not-run")
    assert res.returncode == 0, res.stderr
    cmds = [shlex.split(ln) for ln in res.stdout.splitlines()]
    remote = ["10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
    assert [c[1] for c in cmds if c[0].endswith("must-not-run")] == remote
    assert ["bash", "-c"] == [c for c in cmds if c[0] == "bash"][0][:2]
    assert len(cmds) == 6
    assert all("pkill" in c[-1] and "asyrl run" in c[-1] for c in cmds)


def test_stop_cluster_with_fake_ssh(tmp_path):
    record = tmp_path / "calls"
    hosts = (
        f"--ps_hosts {PS} --memory_hosts {MEM} --learner_hosts {LEARNERS} --actor_hosts {ACTORS}"
    )
    res = _run(STOP_CLUSTER, *hosts.split(), SSH=_recorder(tmp_path / "fake_ssh", record))
    assert res.returncode == 0, res.stderr
    calls = _calls(record)
    assert [c[0] for c in calls] == [f"10.0.0.{i}" for i in range(1, 7)]
    assert all(c[1].startswith("pkill ") for c in calls)


def test_stop_cluster_bad_input(tmp_path):
    res = _run(STOP_CLUSTER, "--dry-run")
    assert res.returncode == 2 and "no hosts given" in res.stderr
    res = _run(STOP_CLUSTER, "--ps_hosts", "10.0.0.1", "--dry-run")
    assert res.returncode == 2 and "host:port" in res.stderr
