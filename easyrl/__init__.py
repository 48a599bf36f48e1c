"""easyrl: distributed reinforcement learning on TensorFlow 2 and gRPC.

`easyrl.train(config_or_path, **overrides)` runs a whole local cluster and returns a
`TrainResult` (see `easyrl.api`). Both are imported on first use, so `import easyrl` stays cheap.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # for type checkers; at run time `__getattr__` imports them on first use
    from easyrl.api import TrainResult, train

__all__ = ["TrainResult", "__version__", "train"]

_LAZY = {"train": "easyrl.api", "TrainResult": "easyrl.api"}


def __getattr__(name: str):
    """Imports `train` and `TrainResult` from `easyrl.api` when first asked for."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'easyrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
