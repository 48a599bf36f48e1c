"""Importing TensorFlow quietly, as every entry point does (`easyrl` commands, `easyrl.train`,
the tools): without Keras, and without the notices a CPU-only machine's GPU probe prints.

Import TensorFlow through `import_tensorflow_quietly()` first; a plain `import tensorflow`
afterwards gets the module already imported. Everything that can be checked without
TensorFlow (config, env ids, run directories) is checked before calling it: the import takes
seconds of CPU.
"""

import contextlib
import os
import re
import sys
import tempfile

__all__ = ["KERAS_AT_IMPORT", "TF_PROBE_NOISE", "import_tensorflow_quietly"]

TF_PROBE_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on"
    r"|Could not find cuda drivers|failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) "
    r"factory|computation placer already registered|TF-TRT Warning: Could not find TensorRT"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|rebuild TensorFlow with the appropriate compiler flags"
)
"""What TensorFlow prints to stderr while it is imported and looks for a GPU, on a machine
without one (or without its driver): notices, not errors."""

KERAS_AT_IMPORT = "keras.src.optimizers"
"""What `import tensorflow` imports of Keras at once (to register Keras's optimizers early):
all of Keras, and matplotlib where it is installed, ~1 CPU-second. easyrl's networks are
`tf.Module`s, so its processes import TensorFlow without it; Keras is imported on first use
(`tf.keras`, `import keras`, a Keras `model.kind`), which registers its optimizers then."""


@contextlib.contextmanager
def _keras_deferred():
    """Within it, importing `KERAS_AT_IMPORT` fails (TensorFlow skips it: it catches the
    ImportError); afterwards it imports as usual."""
    deferred = KERAS_AT_IMPORT not in sys.modules
    if deferred:
        sys.modules[KERAS_AT_IMPORT] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if deferred and KERAS_AT_IMPORT in sys.modules and sys.modules[KERAS_AT_IMPORT] is None:
            del sys.modules[KERAS_AT_IMPORT]


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow (without Keras, see `KERAS_AT_IMPORT`) and lets it look for GPUs
    with stderr (fd 2) captured, then replays every captured line but `TF_PROBE_NOISE`: a
    CPU-only machine's probe notices (its C++ logging ignores TF_CPP_MIN_LOG_LEVEL before
    absl is initialised, and a failed cuInit is logged as an error) are dropped; anything
    else, an import error's traceback included, is still printed.

    TF_CPP_MIN_LOG_LEVEL defaults to 2 (warnings and errors only; a value set by the user is
    kept), for this process and the processes it starts. Once TensorFlow is imported and has
    probed, a further call costs microseconds (a TensorFlow the user imported already still
    probes quietly here)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        capture_file = tempfile.TemporaryFile()
    except OSError:  # no writable temporary directory: import it as it is, notices and all
        with _keras_deferred():
            import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with capture_file as capture:
        os.dup2(capture.fileno(), 2)
        try:
            with _keras_deferred():
                import tensorflow as tf

            tf.config.list_physical_devices("GPU")
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not TF_PROBE_NOISE.search(line)))
            sys.stderr.flush()
