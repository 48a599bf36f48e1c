"""Bad input is refused with a message naming what is wrong, before TensorFlow is imported.

The cases are `benchmarks/bench_errors.py`'s (which times them as `easyrl` subprocesses): a
missing config file, invalid YAML, an unknown key, a wrong type, a value out of range, an
unknown env id, a missing extra, a used `run.dir`, `--resume` of no run and of a run whose
budget is spent, and `rollout` / `export` / `plot` on a directory that is no run. Here they
all run through the CLI's `main` in one fresh Python process, which then reports whether
anything imported TensorFlow or Keras.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import benchmark_scripts
import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from easyrl.cli import main

    results = []
    for args in json.loads(sys.argv[1]):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = main(args)
        results.append([code, stderr.getvalue()])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
    print(json.dumps({"results": results, "imported": heavy}))
    """
)


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """(the cases, {case name: (exit code, stderr)}, the TensorFlow/Keras modules imported)."""
    cases = benchmark_scripts.load("bench_errors").cases(tmp_path_factory.mktemp("bad_inputs"))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps([case.args for case in cases])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    by_name = {case.name: tuple(result) for case, result in zip(cases, report["results"])}
    return cases, by_name, report["imported"]


@pytest.mark.cluster
def test_every_bad_input_is_refused_naming_the_key_or_path(refused):
    cases, by_name, _ = refused
    assert len(cases) >= 12  # the missing-extra case only where Box2D or envpool is missing
    for case in cases:
        code, stderr = by_name[case.name]
        assert code == 2, (case.name, stderr)
        assert stderr.startswith("easyrl: error: "), (case.name, stderr)
        assert "Traceback" not in stderr, (case.name, stderr)
        for text in case.expect:
            assert text in stderr, (case.name, text, stderr)


@pytest.mark.cluster
def test_no_bad_input_waits_for_tensorflow(refused):
    """None of the refusals imported TensorFlow or Keras (seconds of CPU each)."""
    assert refused[2] == []


def test_a_range_error_of_an_algorithm_names_the_dotted_key():
    """A Params class's own check ("<algo>: <field> ...") is reported under its config key,
    for every algorithm, by the loader."""
    from easyrl import config as config_lib
    from easyrl.errors import ConfigError

    cases = [
        ("ppo", "clip", -1.0, "algorithm.clip must be > 0, got -1.0"),
        ("dqn", "gamma", 2.0, "algorithm.gamma must be in [0, 1], got 2.0"),
        ("sac", "tau", 0.0, "algorithm.tau must be in (0, 1], got 0.0"),
        ("bc", "beta", 1.0, "algorithm.beta is fixed at 0"),
    ]
    for name, key, value, message in cases:
        raw = {"algorithm": {"name": name, key: value}, "env": {"id": "CartPole-v1"}}
        with pytest.raises(ConfigError) as err:
            config_lib.from_dict(raw)
        assert str(err.value).startswith(message), (name, str(err.value))
