"""Maps names in a config to the code that implements them.

The runtime never imports a concrete algorithm: it asks this registry. `algorithm.name` is
either a built-in name (`known()`) or the name of a module of user code
(`algorithm.name: my_pkg.my_algo`, or `my_algo` for a top-level module), imported like a
built-in one. `load_object` resolves the `"module:attribute"` paths that name other user code
(custom torsos, `model.kind: my_pkg.nets:MyTorso`).

Adding an algorithm: write one module (a package like `easyrl/algorithms/dqn/` or any
importable module of your own) that declares `SPEC = AlgorithmSpec(...)`
(`easyrl.algorithms.contract`): its flow, replay kinds, a frozen `Params` dataclass (with the
`RuntimeParams` the runtime reads: `max_staleness`, and `batch_size` when learners sample
batches), `build` (returning the flow's agent protocol), `optimizer`, `replay_spec`,
`round_share` for synchronous rounds, and what it can do (model kinds, recurrence, action
masks, multi-agent runs, datasets). The registry reads the spec and nothing else of the
module. `easyrl.algorithms.dqn` is the shortest model to copy; `examples/custom/` shows one
outside the package.

Register a built-in one in `_MODULES`; a module of your own needs no registration:
`algorithm.name: my_pkg.my_algo` (it must be importable by every process of the run; the
local launcher hands its own import path to the processes it starts).
"""

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

from easyrl.algorithms.contract import AlgorithmSpec
from easyrl.errors import ConfigError
from easyrl.imports import import_module

_MODULES = {
    "a2c": "easyrl.algorithms.a2c",
    "a3c": "easyrl.algorithms.a3c",
    "bc": "easyrl.algorithms.bc",
    "bcq": "easyrl.algorithms.bcq",
    "ddpg": "easyrl.algorithms.ddpg",
    "dqn": "easyrl.algorithms.dqn",
    "es": "easyrl.algorithms.es",
    "impala": "easyrl.algorithms.impala",
    "linucb": "easyrl.algorithms.linucb",
    "marwil": "easyrl.algorithms.marwil",
    "pg": "easyrl.algorithms.pg",
    "ppo": "easyrl.algorithms.ppo",
    "r2d2": "easyrl.algorithms.r2d2",
    "sac": "easyrl.algorithms.sac",
    "td3": "easyrl.algorithms.td3",
}


def known() -> list[str]:
    """Returns the registered algorithm names, sorted."""
    return sorted(_MODULES)


def module(name: str) -> ModuleType:
    """Returns the module implementing algorithm `name`: a registered name, or the name of
    an importable module of user code (`my_algo`, `my_pkg.my_algo`) that declares its `SPEC`
    (see above).

    Raises:
        ConfigError: `name` is neither registered nor an importable module (the message lists
            the known names), the module fails to import, or it declares no valid `SPEC`.
    """
    if name in _MODULES:
        found = importlib.import_module(_MODULES[name])
    elif "." not in name and not (name.isidentifier() and importlib.util.find_spec(name)):
        raise ConfigError(
            f"algorithm.name: unknown algorithm {name!r}; known algorithms: {', '.join(known())} "
            "(or the name of your own algorithm module, e.g. my_pkg.my_algo)"
        )
    else:
        try:
            found = import_module(name, f"algorithm.name {name!r}")
        except ConfigError as err:
            if isinstance(err.__cause__, ImportError):  # the message names the module
                raise
            # Raised by the module's code, as its SPEC's own check: say which module.
            raise ConfigError(f"algorithm.name: module {name!r}: {err}") from err
    if not isinstance(vars(found).get("SPEC"), AlgorithmSpec):
        raise ConfigError(
            f"algorithm.name: module {name!r} is not an algorithm module: it declares no "
            "SPEC = easyrl.algorithms.contract.AlgorithmSpec(flow=..., replay_kinds=..., "
            "params_class=..., build=..., optimizer=..., replay_spec=...)"
        )
    return found


def spec(name: str) -> AlgorithmSpec:
    """The `SPEC` of algorithm `name`'s module (see `module`).

    Raises:
        ConfigError: as `module`.
    """
    return module(name).SPEC


def known_where(has: Callable[[AlgorithmSpec], object]) -> list[str]:
    """The registered algorithms whose spec `has` (a capability: `lambda s: s.multiagent`),
    sorted: what an error message offers instead."""
    return [n for n in known() if has(spec(n))]


def check_model_kind(name: str, model: Any, kinds: tuple[str, ...]) -> None:
    """Checks `model.kind` against an algorithm's `model_kinds` ("custom": any
    `package.module:Class` torso; "encoders": `model.encoders` may be set), as loading a
    config does, for a direct `build` call.

    Raises:
        ConfigError: algorithm `name` cannot build its networks from `model.kind`, or takes no
            `model.encoders`.
    """
    torsos = [k for k in kinds if k != "encoders"]
    if ("custom" if ":" in model.kind else model.kind) not in torsos:
        raise ConfigError(
            f"model.kind: {name} builds its networks from model.kind {' or '.join(torsos)} "
            f"('custom' = a module:Class torso), got {model.kind!r}"
        )
    if getattr(model, "encoders", None) and "encoders" not in kinds:
        able = known_where(lambda s: "encoders" in s.model_kinds)
        raise ConfigError(
            f"model.encoders: {name} has no per-key encoders (algorithms with them: "
            f"{', '.join(able)}); set model.encoders: {{}}"
        )


def masking() -> list[str]:
    """The registered algorithms that honour an observation's action mask (their spec sets
    `action_masks`; see `easyrl.envs.flat`), sorted."""
    return known_where(lambda s: s.action_masks)


def check_spaces(name: str, env_id: str, obs_space) -> None:
    """Refuses an env whose observations carry an action mask (`easyrl.envs.flat`) for an
    algorithm that cannot honour it; `easyrl train` checks this before starting any role,
    and every role again when it reads the spaces.

    Raises:
        ConfigError: naming the env, the algorithm and the algorithms that can.
    """
    from easyrl.envs.flat import action_mask_size

    if action_mask_size(obs_space) and not spec(name).action_masks:
        raise ConfigError(
            f"algorithm.name: {env_id}'s observations carry an action_mask, which {name} "
            f"cannot honour; algorithms that can: {', '.join(masking())}"
        )


def params_class(name: str) -> type:
    """Returns the hyper-parameter dataclass of algorithm `name` (see `module`)."""
    return spec(name).params_class


def replay_spec(cfg, obs_space, action_space) -> dict:
    """The replay columns of one item of the run `cfg` describes: the algorithm's
    `replay_spec`, given `model.lstm` when it is set (only a recurrent algorithm accepts
    it; the config refuses it for the others), plus the `policy` column of a multi-agent
    run."""
    found = spec(cfg.algorithm.name)
    columns = found.replay_spec(cfg.algorithm.params, obs_space, action_space, **_lstm(cfg))
    if cfg.multiagent.enabled:  # items carry their policy's index
        from easyrl.algorithms import multiagent

        columns = multiagent.replay_spec(columns)
    return columns


def round_share(cfg, actor_index: int, num_actors: int) -> int:
    """The items actor `actor_index` of `num_actors` ships per round (sync_rounds): the
    algorithm's `round_share`, given `model.lstm` when it is set (as `replay_spec`); a
    multi-agent run's actor steps one env per slot (env copy x agent).

    Raises:
        ConfigError: the algorithm's flow is not sync_rounds (its spec has no round_share).
    """
    share = spec(cfg.algorithm.name).round_share
    if share is None:
        raise ConfigError(f"algorithm.name: {cfg.algorithm.name} trains no synchronous rounds")
    params, num_envs = cfg.algorithm.params, cfg.env.num_envs
    if cfg.multiagent.enabled:  # one env per slot (env copy x agent)
        from easyrl.envs.multiagent import agent_spaces

        num_envs *= len(agent_spaces(cfg.env.id, cfg.env.kwargs)[0])
    return share(params, num_envs, actor_index, num_actors, **_lstm(cfg))


def _lstm(cfg) -> dict:
    """{"lstm": units} for an algorithm call when `model.lstm` is set, else {}."""
    return {"lstm": cfg.model.lstm} if cfg.model.lstm else {}
