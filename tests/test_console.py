"""What a user sees on the console: `easyrl --version`, and TensorFlow's GPU-probe notices
on a CPU-only machine dropped while anything else it prints still shows."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

import easyrl

pytestmark = pytest.mark.cluster

FAKE_TENSORFLOW = """
import os
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written\\n")
os.write(2, b"I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers on your machine\\n")
os.write(2, b"E0000 00:00:1.0 1 kernel.cc:9] a real error of the import\\n")
{extra}

class config:
    @staticmethod
    def list_physical_devices(kind):
        os.write(2, b"E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL\\n")
        return []
"""


def _import_quietly(tmp_path, extra: str = "") -> subprocess.CompletedProcess:
    """`import_tensorflow_quietly()` in a child whose `tensorflow` is a fake printing the
    CPU-only probe's lines and one real error (fast, and the same on a GPU machine)."""
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_TENSORFLOW.format(extra=textwrap.dedent(extra)))
    code = "from easyrl.cli import import_tensorflow_quietly; import_tensorflow_quietly()"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}", "PATH": "/usr/bin:/bin"},
    )


def test_version():
    done = subprocess.run(
        [sys.executable, "-m", "easyrl.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == f"easyrl {easyrl.__version__}"


def test_the_gpu_probe_notices_are_dropped_and_real_errors_kept(tmp_path):
    done = _import_quietly(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "E0000 00:00:1.0 1 kernel.cc:9] a real error of the import\n"


def test_a_failing_import_still_shows_its_traceback(tmp_path):
    done = _import_quietly(
        tmp_path, 'raise ImportError("libtensorflow_framework.so.2: cannot open")'
    )
    assert done.returncode == 1
    assert "a real error of the import" in done.stderr
    assert "ImportError: libtensorflow_framework.so.2: cannot open" in done.stderr
    assert "cuda" not in done.stderr.lower()


def test_tensorflow_is_imported_without_keras_which_still_imports_on_first_use(tmp_path):
    """Real TensorFlow in a child: `import_tensorflow_quietly` leaves Keras (and matplotlib,
    which Keras imports when installed) out of the process; `tf.keras` still works after."""
    code = textwrap.dedent(
        """
        import sys
        from easyrl.cli import import_tensorflow_quietly
        import_tensorflow_quietly()
        import tensorflow as tf
        print(sorted(m for m in ("keras", "matplotlib") if m in sys.modules))
        layer = tf.keras.layers.Dense(2)
        print(tuple(layer(tf.zeros([1, 3])).shape), "keras" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "(1, 2) True"]


CHILD = """
import os, sys, time
from easyrl.cluster.launcher import adopt_start_env
adopt_start_env()
print(sorted(os.sched_getaffinity(0)), sorted(k for k in os.environ if k.startswith("EASYRL_")))
sys.stdout.flush()
time.sleep(float(sys.argv[1]))
"""


def _child_env(**changes) -> dict:
    return {**os.environ, **changes}


def test_a_child_pins_itself_to_its_cores_and_clears_what_it_was_given():
    from easyrl.cluster.launcher import start_env

    core = min(os.sched_getaffinity(0))
    env = _child_env(**start_env([core]))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[{core}] []"


def test_a_child_whose_parent_is_gone_already_ends_at_start_up():
    # Started "by" a process that is not its parent (as if the launcher had died between
    # the fork and the child's start-up): it must not run on as an orphan.
    env = _child_env(EASYRL_PARENT_PID="1" if os.getpid() != 1 else "2")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "30"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == -15  # SIGTERM, before the 30 s sleep


def test_a_child_dies_with_the_process_that_started_it(tmp_path):
    # A middle process starts a child as the launcher does (`start_env`), reports its pid
    # and exits; the kernel then SIGTERMs the child.
    middle = f"""
import subprocess, sys
from easyrl.cluster.launcher import start_env
import os
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}, "60"],
                         env={{**os.environ, **start_env()}}, stdout=subprocess.PIPE, text=True)
child.stdout.readline()  # it has adopted its start env
print(child.pid, flush=True)
"""
    out = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[1].startswith("Z"):
                return  # ended; a zombie until init reaps it
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError("the child outlived the process that started it")
