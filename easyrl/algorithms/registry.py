"""Maps `algorithm.name` in a config to the module that implements it.

The runtime never imports a concrete algorithm: it asks this registry. Each
algorithm module exposes `Params` (a frozen dataclass of hyper-parameters) and
`Algorithm` (built from the full config and the environment's spaces).
"""

import importlib
from types import ModuleType

from easyrl.errors import ConfigError

_MODULES = {
    "a3c": "easyrl.algorithms.a3c",
    "ddpg": "easyrl.algorithms.ddpg",
    "dqn": "easyrl.algorithms.dqn",
    "es": "easyrl.algorithms.es",
    "impala": "easyrl.algorithms.impala",
    "ppo": "easyrl.algorithms.ppo",
    "sac": "easyrl.algorithms.sac",
    "td3": "easyrl.algorithms.td3",
}


def known() -> list[str]:
    """Returns the registered algorithm names, sorted."""
    return sorted(_MODULES)


def module(name: str) -> ModuleType:
    """Returns the module implementing algorithm `name`.

    Raises:
        ConfigError: `name` is not registered; the message lists the known names.
    """
    if name not in _MODULES:
        raise ConfigError(
            f"algorithm.name: unknown algorithm {name!r}; known algorithms: {', '.join(known())}"
        )
    return importlib.import_module(_MODULES[name])


def params_class(name: str) -> type:
    """Returns the hyper-parameter dataclass of algorithm `name` (see `module`)."""
    return module(name).Params
