"""Maps names in a config to the code that implements them.

The runtime never imports a concrete algorithm: it asks this registry. `algorithm.name` is
either a built-in name (`known()`) or the name of a module of user code
(`algorithm.name: my_pkg.my_algo`, or `my_algo` for a top-level module), imported like a
built-in one. `load_object` resolves the `"module:attribute"` paths that name other user code
(custom torsos, `model.kind: my_pkg.nets:MyTorso`).

Adding an algorithm: write one module (a package like `easyrl/algorithms/dqn/` or any
importable module of your own) that exposes

    FLOW          "async_replay", "sync_rounds" or "actor_gradients": the loop the actor and
                  learner run (see `easyrl.roles.actor` and `easyrl.roles.learner`).
    REPLAY_KINDS  the replay table kinds it works with, the default first ("uniform",
                  "prioritized", "trajectory", "aggregate"); () for no replay memory.
    MODEL_KINDS   (optional, default ("mlp",)) the `model.kind`s its networks are built from:
                  "mlp", "conv", "custom" (a `module:Class` torso via `models.build_torso`).
    Params        a frozen dataclass of hyper-parameters, each field typed, with a default and
                  a one-line docstring under it; the config's `algorithm` keys next to `name`
                  load into it, strictly. Check values in `__post_init__` (raise ConfigError).
    optimizer(params)
                  the optimizer the PS shards apply gradients with (an
                  `easyrl.algorithms.optimizers.OptimizerSpec`, or {variable prefix: spec}).
    replay_spec(params, obs_space, action_space)
                  the replay columns, {name: (per-item shape, numpy dtype)} (when REPLAY_KINDS
                  is not empty, or actors build such items themselves).
    round_share(params, num_envs, actor_index, num_actors)
                  (sync_rounds only) the items one actor ships per round.
    build(params, obs_space, action_space, model, seed=0, learner=False)
                  the TF side: an object with `flow`, `variables` ({name: tf.Variable}, the
                  names every process agrees on), `greedy`, and the flow's hooks (`collector`,
                  `learn` / `learn_round`, ...); `easyrl.algorithms.dqn` is the shortest model to
                  copy. Import TensorFlow here, not at module level, so that loading a config
                  stays cheap.

Register a built-in one in `_MODULES`; a module of your own needs no registration:
`algorithm.name: my_pkg.my_algo` (it must be importable by every process of the run; the
local launcher hands its own import path to the processes it starts).
"""

import dataclasses
import importlib
import importlib.util
from types import ModuleType
from typing import Any

from easyrl.errors import ConfigError

_MODULES = {
    "a3c": "easyrl.algorithms.a3c",
    "bc": "easyrl.algorithms.bc",
    "bcq": "easyrl.algorithms.bcq",
    "ddpg": "easyrl.algorithms.ddpg",
    "dqn": "easyrl.algorithms.dqn",
    "es": "easyrl.algorithms.es",
    "impala": "easyrl.algorithms.impala",
    "linucb": "easyrl.algorithms.linucb",
    "marwil": "easyrl.algorithms.marwil",
    "ppo": "easyrl.algorithms.ppo",
    "sac": "easyrl.algorithms.sac",
    "td3": "easyrl.algorithms.td3",
}

FLOWS = ("async_replay", "sync_rounds", "actor_gradients")
"""The execution flows an algorithm module's FLOW may name."""


def known() -> list[str]:
    """Returns the registered algorithm names, sorted."""
    return sorted(_MODULES)


def import_module(name: str, what: str) -> ModuleType:
    """Imports module `name` of user code that the config value `what` names.

    Raises:
        ConfigError: the module cannot be imported; the message names `what` and the cause.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(f"cannot import module {name!r} of {what}: {err}") from err


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


def module(name: str) -> ModuleType:
    """Returns the module implementing algorithm `name`: a registered name, or the name of
    an importable module of user code (`my_algo`, `my_pkg.my_algo`) that follows the
    contract above.

    Raises:
        ConfigError: `name` is neither registered nor an importable module (the message lists
            the known names), the module fails to import, or it lacks part of the contract.
    """
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if "." not in name and not (name.isidentifier() and importlib.util.find_spec(name)):
        raise ConfigError(
            f"algorithm.name: unknown algorithm {name!r}; known algorithms: {', '.join(known())} "
            "(or the name of your own algorithm module, e.g. my_pkg.my_algo)"
        )
    found = import_module(name, f"algorithm.name {name!r}")
    _check_contract(found, name)
    return found


def _check_contract(found: ModuleType, name: str) -> None:
    """Raises ConfigError naming what module `found` lacks of the algorithm contract."""
    required = ["FLOW", "REPLAY_KINDS", "Params", "optimizer", "build"]
    if getattr(found, "REPLAY_KINDS", ()):
        required.append("replay_spec")
    if getattr(found, "FLOW", None) == "sync_rounds":
        required.append("round_share")
    missing = [attr for attr in required if not hasattr(found, attr)]
    if missing:
        raise ConfigError(
            f"algorithm.name: module {name!r} is not an algorithm module: it lacks "
            f"{', '.join(missing)} (see easyrl.algorithms.registry)"
        )
    if not dataclasses.is_dataclass(found.Params):
        raise ConfigError(f"algorithm.name: {name}.Params must be a dataclass")
    if found.FLOW not in FLOWS:
        raise ConfigError(
            f"algorithm.name: module {name!r} has FLOW {found.FLOW!r}; expected one of "
            f"{', '.join(FLOWS)}"
        )


def params_class(name: str) -> type:
    """Returns the hyper-parameter dataclass of algorithm `name` (see `module`)."""
    return module(name).Params
