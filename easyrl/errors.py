"""The easyrl error hierarchy: every error the framework raises on purpose."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


class EasyRLError(Exception):
    """Base class of every error easyrl raises on purpose."""


class ConfigError(EasyRLError):
    """A config file, an override or a cluster spec is invalid."""


def closest(name: object, valid: Sequence[str], n: int = 1) -> list[str]:
    """Up to `n` of `valid` closest to `name` (difflib, ratio >= 0.5), the closest first."""
    return difflib.get_close_matches(str(name), list(valid), n=n, cutoff=0.5)


def did_you_mean(name: object, valid: Sequence[str], otherwise: str = "", n: int = 1) -> str:
    """ "did you mean 'x'?" (or 'x', 'y'?) for the closest of `valid` to `name`; `otherwise`
    when none is close. Every error that names a valid alternative words it so."""
    close = closest(name, valid, n)
    return "did you mean " + ", ".join(map(repr, close)) + "?" if close else otherwise


def check_ranges(owner: str, obj: object, checks: dict[str, tuple[bool, str]]) -> None:
    """Raises ConfigError("<owner>: <field> must be <range>, got <value>") for the first of
    `checks` ({field: (holds, valid range)}) that does not hold. Write each check so that NaN
    fails it (`x > 0`, not `not x <= 0`)."""
    for field, (holds, valid) in checks.items():
        if not holds:
            raise ConfigError(f"{owner}: {field} must be {valid}, got {getattr(obj, field)!r}")


class TransportError(EasyRLError):
    """A gRPC call failed after its retries, or a message could not be encoded."""

    code: grpc.StatusCode | None = None
    """The status of the failed gRPC call (set by `easyrl.transport.rpc.Client.call`);
    None when no call failed (a message could not be encoded or decoded)."""


class MessageTooLarge(TransportError):
    """A server refused a message over its size limit (RESOURCE_EXHAUSTED, like a rate limit,
    but sending it again cannot help)."""


class ReplayError(EasyRLError):
    """A replay table was used against its contract (bad spec, bad keys, empty table)."""


class RateLimitTimeout(ReplayError):
    """A rate-limited insert or sample did not become legal before its deadline."""
