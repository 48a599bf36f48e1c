"""The strict loader, written once over `dataclasses.fields` and the type hints: every
section and the algorithm's own `Params` class load through `_build`, which rejects unknown
keys (suggesting the closest valid one), values of the wrong type and values out of range,
always naming the full dotted key."""

import contextlib
import dataclasses
import functools
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from easyrl.algorithms import learning_rate, registry
from easyrl.config.schema import AlgorithmConfig, _join
from easyrl.errors import ConfigError, closest

# ---------------------------------------------------------------------------------------------
# The generic loader.


def _describe(value: object) -> str:
    """`str 'big'`, `bool True`, `null`: a value as error messages quote it."""
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _is_union(tp: object) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _type_name(tp: object) -> str:
    """A type as error messages name it: `int`, `int | None`, `one of 'a', 'b'`, `list of int`."""
    if tp is type(None):
        return "None"
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type_name(args[0])}"
        return f"list of {len(args)} ({', '.join(_type_name(a) for a in args)})"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return "mapping"
    if origin in (list, Sequence):
        return f"list of {_type_name(get_args(tp)[0])}"
    if tp is Any:
        return "any value"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _mismatch(key: str, expected: str, value: object) -> ConfigError:
    return ConfigError(f"{key}: expected {expected}, got {_describe(value)}")


def _coerce(tp: Any, value: Any, key: str, nullable: bool = False) -> Any:
    """Checks `value` against type `tp` and returns it converted (list -> tuple, int -> float).

    `nullable` only changes the expected type an error names (`int | None` rather than `int`).

    Raises:
        ConfigError: naming `key`, the expected type and the value.
    """
    expected = _type_name(tp) + (" | None" if nullable else "")
    origin = get_origin(tp)
    if tp is Any:
        return value
    if tp is AlgorithmConfig:
        return _load_algorithm(value, key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if _is_union(tp):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:  # Optional[X]: let X report its own (possibly nested) error.
            return _coerce(arms[0], value, key, nullable=len(arms) < len(args))
        for arm in arms:
            with contextlib.suppress(ConfigError):
                return _coerce(arm, value, key)
        raise _mismatch(key, expected, value)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(tp)):
            return value
        raise _mismatch(key, expected, value)
    if tp in (bool, int, str):
        if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
            return value
        raise _mismatch(key, expected, value)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` as a string.
            with contextlib.suppress(ValueError):
                return float(value)
        raise _mismatch(key, expected, value)
    if origin is tuple or origin is list:
        if not isinstance(value, list | tuple):
            raise _mismatch(key, expected, value)
        args = get_args(tp)
        if origin is list:
            return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise _mismatch(key, expected, value)
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _mismatch(key, expected, value)
        key_tp, value_tp = get_args(tp)
        out = {}
        for k, v in value.items():
            _coerce(key_tp, k, f"{key} (key {k!r})")
            out[k] = _coerce(value_tp, v, _join(key, k))
        return out
    raise TypeError(f"easyrl.config cannot load fields of type {tp!r} ({key})")


_MOVED = {"actor.tf_threads": "cluster.threads.actor"}
"""Keys that moved: {old dotted key: new dotted key} (an unknown-key error names the new)."""


def _unknown_key(prefix: str, key: object, valid: Sequence[str]) -> ConfigError:
    dotted = _join(prefix, key)
    if dotted in _MOVED:
        return ConfigError(f"{dotted!r} moved to {_MOVED[dotted]!r}")
    close = closest(key, valid)
    if close:
        return ConfigError(f"unknown key {dotted!r}; did you mean {_join(prefix, close[0])!r}?")
    where = f"of {prefix!r}" if prefix else "at top level"
    return ConfigError(f"unknown key {dotted!r}; valid keys {where}: {', '.join(sorted(valid))}")


def _build(cls: type, raw: Any, prefix: str, extra_keys: Sequence[str] = ()) -> Any:
    """Builds dataclass `cls` from mapping `raw`, whose keys sit under dotted `prefix`.

    `extra_keys` are keys the caller handled itself; they count as valid in suggestions.

    Raises:
        ConfigError: `raw` is not a mapping, has an unknown key, lacks a required key, or holds a
            value of the wrong type or out of range.
    """
    if not isinstance(raw, Mapping):
        what = prefix or "config"
        raise ConfigError(f"{what}: expected a mapping, got {_describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in raw:
        if key not in fields:
            raise _unknown_key(prefix, key, [*fields, *extra_keys])
    for name, f in fields.items():
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and name not in raw:
            raise ConfigError(f"missing required key {_join(prefix, name)!r}")
    hints = _hints(cls)
    values = {name: _coerce(hints[name], raw[name], _join(prefix, name)) for name in raw}
    try:
        return cls(**values)
    except ConfigError as err:  # a rule of the section: name the key where it sits
        raise _at_key(err, cls, prefix) from None


_OWNED_FIELD = re.compile(r"[^\s:]+: (\w+)\b")
"""How a Params class's own check names a field: "<owner>: <field> ..." (`check_ranges`)."""


def _at_key(err: ConfigError, cls: type, prefix: str) -> ConfigError:
    """The ConfigError `cls(...)` raised, naming the dotted key under `prefix`: a section's
    rule names its key under `cls.SECTION` (which differs where a section sits at several
    places, `model.encoders.<key>`); a Params class's check names "<owner>: <field>"
    (`ppo: clip must be > 0` becomes `algorithm.clip must be > 0`)."""
    text, section = str(err), getattr(cls, "SECTION", "")
    if section and section != prefix and text.startswith(section):
        return ConfigError(prefix + text.removeprefix(section))
    owned = _OWNED_FIELD.match(text)
    fields = {f.name for f in dataclasses.fields(cls)}
    if not section and owned and owned[1] in fields:
        return ConfigError(_join(prefix, owned[1]) + text[owned.end() :])
    return err


def _load_algorithm(raw: Any, key: str) -> AlgorithmConfig:
    """Loads the `algorithm` section: `name` picks the Params class the other keys load into."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: expected a mapping with a 'name' key, got {_describe(raw)}")
    if "name" not in raw:
        raise ConfigError(
            f"{key}.name is required; known algorithms: {', '.join(registry.known())}"
        )
    name = _coerce(str, raw["name"], f"{key}.name")
    params_cls = registry.params_class(name)
    learning_rate.refuse_old_keys(name, raw, key)
    params = _build(params_cls, {k: v for k, v in raw.items() if k != "name"}, key, ("name",))
    return AlgorithmConfig(name=name, params=params)
