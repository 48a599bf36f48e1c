"""Run configuration: YAML -> nested frozen dataclasses, loaded strictly.

A config file is a mapping of sections. Every section is a frozen dataclass below whose fields
carry a typed default and a one-line docstring; only `algorithm` is required:

    algorithm: {name: dqn, gamma: 0.99, n_step: 3}   # flat params next to `name`
    replay: {capacity: 200000, alpha: 0.6}
    cluster: {actor: 4}

The loader is written once over `dataclasses.fields` and the type hints, and is used for every
section and for the algorithm's own `Params` class (see `easyrl.algorithms.registry`). It
rejects unknown keys (suggesting the closest valid one), values of the wrong type and values out
of range, always naming the full dotted key. Command-line style overrides (`replay.capacity=5000`)
are applied to the raw mapping before loading, so they go through the same checks.
"""

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from easyrl.algorithms import registry
from easyrl.algorithms.contract import AlgorithmSpec
from easyrl.config.loader import _build, _describe
from easyrl.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    AtariConfig,
    ClusterConfig,
    Config,
    EncoderConfig,
    EnvConfig,
    EvalConfig,
    InputConfig,
    LearnerConfig,
    ModelConfig,
    MultiAgentConfig,
    OutputConfig,
    ReplayConfig,
    RunConfig,
    SecurityConfig,
    StopConfig,
    ThreadsConfig,
)
from easyrl.errors import ConfigError
from easyrl.imports import load_object
from easyrl.replay import kinds as replay_kinds
from easyrl.seeds import check_deterministic

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ClusterConfig",
    "Config",
    "EnvConfig",
    "LearnerConfig",
    "EncoderConfig",
    "ModelConfig",
    "MultiAgentConfig",
    "ReplayConfig",
    "AtariConfig",
    "EvalConfig",
    "InputConfig",
    "OutputConfig",
    "RunConfig",
    "SecurityConfig",
    "StopConfig",
    "ThreadsConfig",
    "apply_overrides",
    "dump",
    "from_dict",
    "load",
    "save",
    "to_dict",
]

# ---------------------------------------------------------------------------------------------
# Public API.


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Applies `dotted.key=value` overrides to a copy of a raw config mapping.

    Each value is parsed with `yaml.safe_load`, so `3`, `true`, `null` and `[64, 64]` work
    (`1e-3` stays a string, which float fields accept). Intermediate mappings are created as
    needed. Keys are not checked here; `from_dict` checks them.

    Args:
        raw: the raw config mapping; it is not modified.
        overrides: strings of the form `section.key=value`.

    Returns:
        A deep copy of `raw` with the overrides applied, in order.

    Raises:
        ConfigError: an override is malformed (no `=`, an empty key part, unparsable YAML) or
            descends into a value that is not a mapping.
    """
    out = copy.deepcopy(dict(raw))
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a sequence of strings, got str {overrides!r}")
    for override in overrides:
        if not isinstance(override, str) or "=" not in override:
            raise ConfigError(f"malformed override {override!r}: expected dotted.key=value")
        dotted, text = override.split("=", 1)
        parts = [p.strip() for p in dotted.split(".")]
        if not all(parts):
            raise ConfigError(f"malformed override {override!r}: empty key in {dotted!r}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"malformed override {override!r}: bad YAML value: {e}") from e
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is not None and not isinstance(child, Mapping):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"override {override!r}: {where!r} is {_describe(child)}, not a mapping"
                )
            if not isinstance(child, dict):  # None, or a mapping of another type
                node[part] = dict(child or {})
            node = node[part]
        node[parts[-1]] = value
    return out


def from_dict(raw: Mapping[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Builds a Config from a raw mapping (as YAML loads it), strictly.

    Args:
        raw: the config mapping; must contain `algorithm: {name: ...}`; it is not modified.
        overrides: `dotted.key=value` strings applied first (see `apply_overrides`).

    Returns:
        The frozen Config; missing sections and keys take their defaults.

    Raises:
        ConfigError: an unknown key (naming the dotted key and the closest valid one), a value
            of the wrong type or out of range, a section that is not a mapping, a missing or
            unknown `algorithm.name`, or a malformed override.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: expected a mapping at top level, got {_describe(raw)}")
    raw = apply_overrides(raw, overrides)
    if "algorithm" not in raw:
        raise ConfigError(
            "missing required section 'algorithm' (a mapping with a 'name' key; known "
            f"algorithms: {', '.join(registry.known())})"
        )
    return _resolve(_build(Config, raw, ""))


def _resolve(cfg: Config) -> Config:
    """Fills in what the algorithm decides (the replay kind), checks that the sections
    fit the algorithm's flow and imports a custom torso's module (so a bad path fails here).

    Raises:
        ConfigError: the replay kind or the cluster shape does not suit the algorithm, or
            `model.kind` names an object that cannot be imported or called.
    """
    spec = registry.spec(cfg.algorithm.name)
    kinds = spec.replay_kinds
    kind = cfg.replay.kind or (kinds[0] if kinds else None)
    if kind not in kinds and kind is not None:
        # A built-in kind works where the spec lists it; a kind of your own wherever its
        # items fit (`replay_kinds.fits`).
        found = replay_kinds.get(kind)
        why = "a built-in kind it does not list" if kind in replay_kinds.BUILT_IN else None
        why = why or replay_kinds.fits(found, kinds)
        if why is not None:
            works = f"works with {' or '.join(kinds)}" if kinds else "uses no replay memory"
            raise ConfigError(f"replay.kind: {cfg.algorithm.name} {works}, got {kind!r} ({why})")
    if kind is not None:  # the kind's own checks of the section
        replay_kinds.get(kind).check(cfg.replay)
    if ":" in cfg.model.kind and not callable(load_object(cfg.model.kind, "model.kind")):
        raise ConfigError(f"model.kind: {cfg.model.kind!r} is not a class or function")
    registry.check_model_kind(cfg.algorithm.name, cfg.model, spec.model_kinds)
    if cfg.model.lstm < 0:
        raise ConfigError(f"model.lstm: units must be >= 0 (0: no LSTM), got {cfg.model.lstm}")
    if cfg.model.lstm and spec.recurrence == "no":
        recurrent = registry.known_where(lambda s: s.recurrence != "no")
        raise ConfigError(
            f"model.lstm: {cfg.algorithm.name} has no recurrent policy (algorithms with one: "
            f"{', '.join(recurrent)}); set model.lstm: 0"
        )
    if spec.recurrence == "only" and not cfg.model.lstm:
        raise ConfigError(
            f"model.lstm: {cfg.algorithm.name} needs an LSTM core: set its units (e.g. 64)"
        )
    if cfg.stop.eval_return_mean is not None and not cfg.cluster.evaluator:
        raise ConfigError("stop.eval_return_mean needs an evaluator: set cluster.evaluator: 1")
    if cfg.multiagent.enabled:
        if not spec.multiagent:
            raise ConfigError(
                f"multiagent: {cfg.algorithm.name} has no multi-agent training; algorithms "
                f"with one: {', '.join(registry.known_where(lambda s: s.multiagent))}"
            )
        from easyrl.algorithms.multiagent import check_config

        check_config(cfg)
    cfg = _resolve_offline(cfg, spec)
    cluster = _resolve_cluster(cfg.algorithm.name, spec.flow, cfg.cluster)
    cfg = dataclasses.replace(cfg, cluster=cluster)
    if spec.flow == "sync_rounds":
        if cfg.cluster.learner != 1:
            raise ConfigError(
                f"cluster.learner: {cfg.algorithm.name} trains synchronous rounds on one "
                f"learner (use several GPUs in it instead), got {cfg.cluster.learner}"
            )
        if (cfg.cluster.memory or 0) > (cfg.cluster.actor or 0):
            raise ConfigError(
                f"cluster.memory: {cfg.cluster.memory} memory shards but only "
                f"{cfg.cluster.actor} actors; every shard needs an actor to fill its rounds"
            )
    check_deterministic(cfg, spec.flow)
    kind = cfg.replay.kind or kind  # an offline run samples its dataset uniformly
    return dataclasses.replace(cfg, replay=dataclasses.replace(cfg.replay, kind=kind))


def _resolve_offline(cfg: Config, spec: AlgorithmSpec) -> Config:
    """Checks the `output` and `input` sections against the algorithm, the cluster and the
    dataset; makes their directories absolute; gives an online run 2 actors by default.

    Raises:
        ConfigError: a missing dataset directory (the message gives the record command), a
            dataset of another env or other spaces, an algorithm that cannot train from a
            dataset (no `dataset_items`) or only from one (`offline_only`) without `input.dir`,
            actors or actor-based stop conditions in an offline run (whose `cluster.actor`
            stays None: no actors).
    """
    name, out, inp = cfg.algorithm.name, cfg.output, cfg.input
    if out.dir is not None:
        out = dataclasses.replace(out, dir=str(Path(out.dir).absolute()))
    if inp.dir is None:
        if spec.offline_only:
            raise ConfigError(
                f"input.dir: {name} trains from a recorded dataset only (it has no actors' "
                "collector); set input.dir, e.g. to data/cartpole recorded by `easyrl train "
                "configs/cartpole_record.yaml`"
            )
        actors = 2 if cfg.cluster.actor is None else cfg.cluster.actor
        cluster = dataclasses.replace(cfg.cluster, actor=actors)
        return dataclasses.replace(cfg, cluster=cluster, output=out)
    if spec.dataset_items is None:
        raise ConfigError(
            f"input.dir: {name} cannot train from a dataset (it needs the async_replay flow "
            "and a dataset_items function in its SPEC)"
        )
    if out.dir is not None:
        raise ConfigError("output.dir: an offline run (input.dir) has no actors to record")
    if cfg.replay.kind not in (None, "uniform") or "uniform" not in spec.replay_kinds:
        raise ConfigError(
            f"replay.kind: an offline run (input.dir) samples the dataset uniformly; {name} "
            f"works with {', '.join(spec.replay_kinds)}, got replay.kind {cfg.replay.kind!r}"
        )
    if cfg.cluster.actor is not None:
        raise ConfigError(
            f"cluster.actor: an offline run (input.dir) trains from the dataset without actors; "
            f"leave cluster.actor out, got {cfg.cluster.actor}"
        )
    for key in ("episode_return_mean", "max_env_steps"):
        if getattr(cfg.stop, key) is not None:
            raise ConfigError(
                f"stop.{key}: an offline run (input.dir) steps no training envs; stop it with "
                "stop.eval_return_mean (cluster.evaluator: 1) or stop.max_seconds"
            )
    from easyrl.envs import env_options, env_spaces
    from easyrl.offline.dataset import check_dataset

    directory = str(Path(inp.dir).absolute())
    inp = dataclasses.replace(inp, dir=directory)
    check_dataset(directory, cfg.env.id, *env_spaces(cfg.env.id, **env_options(cfg.env)))
    replay = dataclasses.replace(cfg.replay, kind="uniform")
    return dataclasses.replace(cfg, input=inp, replay=replay)


def _resolve_cluster(name: str, flow: str, cluster: ClusterConfig) -> ClusterConfig:
    """Fills in the memory and learner counts the flow implies and checks the given ones.

    Raises:
        ConfigError: an actor-gradients algorithm given memories or learners, or another
            algorithm given none.
    """
    if flow == "actor_gradients":
        for role in ("memory", "learner"):
            if getattr(cluster, role):
                raise ConfigError(
                    f"cluster.{role}: {name} runs only ps and actor roles (actors push "
                    f"gradients to the PS themselves); set cluster.{role}: 0 or leave it out"
                )
        return dataclasses.replace(cluster, memory=0, learner=0)
    for role in ("memory", "learner"):
        if getattr(cluster, role) == 0:
            raise ConfigError(f"cluster.{role}: {name} needs at least one {role}")
    return dataclasses.replace(
        cluster,
        memory=1 if cluster.memory is None else cluster.memory,
        learner=1 if cluster.learner is None else cluster.learner,
    )


def load(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Loads a Config from a YAML file.

    Args:
        path: the YAML file.
        overrides: `dotted.key=value` strings applied on top of the file (see `apply_overrides`).

    Returns:
        The frozen Config.

    Raises:
        ConfigError: the file cannot be read or parsed, or its content is invalid (see
            `from_dict`).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from e
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"config file {str(path)!r}: expected a mapping at top level, got {_describe(raw)}"
        )
    return from_dict(raw, overrides)


def _plain(value: Any) -> Any:
    """Converts a loaded value to plain YAML-safe types (tuples to lists, dataclasses to dicts)."""
    if isinstance(value, AlgorithmConfig):
        return {"name": value.name, **_plain(value.params)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_dict(cfg: Config) -> dict[str, Any]:
    """Converts a Config to a plain mapping that `from_dict` loads back to an equal Config.

    Args:
        cfg: the config.

    Returns:
        Nested dicts of YAML-safe values; tuples become lists and the algorithm's params sit
        flat next to `algorithm.name`.
    """
    return _plain(cfg)


def dump(cfg: Config) -> str:
    """Returns `cfg` as YAML text (sections and keys in declaration order).

    Args:
        cfg: the config.

    Returns:
        YAML text that `load` reads back to an equal Config.
    """
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def save(cfg: Config, path: str | Path) -> None:
    """Writes `cfg` as YAML to `path`, creating its parent directories.

    Args:
        cfg: the config.
        path: the file to write.

    Raises:
        ConfigError: the file cannot be written.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(cfg))
    except OSError as e:
        raise ConfigError(f"cannot write config file {str(path)!r}: {e}") from e
