"""The benchmark scripts as modules, for tests that call their functions (benchmarks/ is no
package: each script imports its neighbours `report`, `timing`, `procs` and `servers` from
its own directory)."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    """`benchmarks/<name>.py`, imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
