"""Importing the user code a config names: modules (`algorithm.name: my_pkg.my_algo`, env
ids `my_pkg.envs:MyEnv`) and `"module:attribute"` paths (`model.kind: my_pkg.nets:MyTorso`)."""

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from easyrl.errors import ConfigError


def import_module(name: str, what: str) -> ModuleType:
    """Imports module `name` of user code that the config value `what` names.

    Raises:
        ConfigError: the module cannot be imported; the message names `what` and the cause.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(
            f"cannot import module {name!r} of {what}: {err} (easyrl looks in the config "
            "file's directory, the current directory and PYTHONPATH)"
        ) from err


def add_import_roots(*roots: str | Path) -> None:
    """Appends `roots` (absolute) to `sys.path` where missing: where user modules named in a
    config (a custom env, torso or algorithm) are found, as `easyrl train` finds them."""
    for root in map(str, (Path(r).resolve() for r in roots)):
        if root not in sys.path:
            sys.path.append(root)


def load_object(path: str, key: str) -> Any:
    """Returns the object a `"package.module:attribute"` path in the config names.

    Args:
        path: the module's dotted name, a colon, and the attribute (may be dotted, `A.b`).
        key: the dotted config key holding `path`, for error messages.

    Raises:
        ConfigError: `path` is not of that form, its module cannot be imported, or the module
            has no such attribute.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{key}: expected 'package.module:attribute', got {path!r}")
    found: Any = import_module(module_name, f"{key} {path!r}")
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found
