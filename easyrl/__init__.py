"""easyrl: distributed reinforcement learning on TensorFlow 2 and gRPC.

`easyrl.train(config_or_path, callbacks=[...], **overrides)` runs a whole local cluster and
returns a `TrainResult` (see `easyrl.api`); `easyrl.Callback` is the base class of its
callbacks (`easyrl.callbacks`); `easyrl.load(RUN_DIR or EXPORT_DIR)` returns a run's greedy
`Policy`, whose `predict(obs, state=None, episode_start=None)` answers as Stable-Baselines3's
does (`easyrl.policy`). All are imported on first use, so `import easyrl` stays cheap (no
TensorFlow).
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # for type checkers; at run time `__getattr__` imports them on first use
    from easyrl.api import TrainResult, train
    from easyrl.callbacks import Callback
    from easyrl.policy import Policy, load

__all__ = ["Callback", "Policy", "TrainResult", "__version__", "load", "train"]

_LAZY = {
    "train": "easyrl.api",
    "TrainResult": "easyrl.api",
    "Callback": "easyrl.callbacks",
    "load": "easyrl.policy",
    "Policy": "easyrl.policy",
}


def __getattr__(name: str):
    """Imports the public names of `_LAZY` from their modules when first asked for."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'easyrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
