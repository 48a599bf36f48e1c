"""Cluster spec: where the listening roles are and how many workers there are.

Comes from a YAML/JSON file, command-line flags, or the EASYRL_CLUSTER
environment variable (JSON, the way TF_CONFIG works):
`{"ps": ["h0:7000"], "memory": ["h1:7100"], "learner": 1, "actor": 8}`.
"""

import heapq
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from easyrl.errors import ConfigError, did_you_mean

CLUSTER_ENV = "EASYRL_CLUSTER"
ROLES = ("ps", "memory", "learner", "actor", "evaluator")
OPTIONAL = {"evaluator": 0}
"""Roles a spec may leave out, with their default count."""


@dataclass(frozen=True)
class ClusterSpec:
    """Addresses of the PS and memory shards, and the worker counts. Memory shards and
    learners may be absent (A3C: actors push gradients to the PS themselves)."""

    ps: tuple[str, ...]
    memory: tuple[str, ...]
    learner: int
    actor: int
    evaluator: int = 0

    def __post_init__(self):
        # (host, port) -> (role, address as written); hosts compare case-insensitively and
        # ports numerically, so "H0:07000" and "h0:7000" are the same listener.
        seen: dict[tuple[str, int], tuple[str, str]] = {}
        for role in ("ps", "memory"):
            addresses = getattr(self, role)
            if role == "ps" and not addresses:
                raise ConfigError(f"cluster.{role}: at least one address is required")
            for address in addresses:
                host, sep, port = address.rpartition(":")
                # isdigit() alone accepts non-ASCII digits such as "٧" or "²".
                if not sep or not host or not (port.isascii() and port.isdigit()):
                    raise ConfigError(f"cluster.{role}: {address!r} is not host:port")
                if not 1 <= int(port) <= 65535:
                    raise ConfigError(
                        f"cluster.{role}: {address!r} has port {port} outside 1..65535"
                    )
                key = (host.lower(), int(port))
                if key in seen:
                    first_role, first = seen[key]
                    where = "" if first_role == role else f"cluster.{first_role} "
                    raise ConfigError(
                        f"cluster.{role}: address {address!r} is listed twice "
                        f"(also as {where}{first!r})"
                    )
                seen[key] = (role, address)
        for role in ("actor", "learner", "evaluator"):  # actor 0: an offline run (input.dir)
            if getattr(self, role) < 0:
                raise ConfigError(f"cluster.{role}: must be >= 0")

    def to_json(self) -> str:
        """Serializes the spec as the JSON the EASYRL_CLUSTER variable holds."""
        return json.dumps(asdict(self))

    @classmethod
    def from_mapping(cls, raw: Mapping) -> "ClusterSpec":
        """Builds a spec from {"ps": [...], "memory": [...], "learner": n, "actor": n}.

        Raises:
            ConfigError: unknown key (with the closest valid one), or a bad value.
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("cluster spec must be a mapping")
        for key in raw:
            if key not in ROLES:
                hint = did_you_mean(key, ROLES, f"valid keys: {ROLES}")
                raise ConfigError(f"cluster spec: unknown key {key!r}; {hint}")
        missing = [k for k in ROLES if k not in raw and k not in OPTIONAL]
        if missing:
            raise ConfigError(f"cluster spec: missing {', '.join(missing)}")
        fields = {}
        for role in ("ps", "memory"):
            value = raw[role]
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"cluster.{role}: expected a list of host:port")
            fields[role] = tuple(value)
        for role in ("learner", "actor", "evaluator"):
            value = raw.get(role, OPTIONAL.get(role))
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"cluster.{role}: expected an int, got {value!r}")
            fields[role] = value
        return cls(**fields)

    @classmethod
    def from_file(cls, path: str | Path) -> "ClusterSpec":
        """Loads a YAML or JSON cluster file (see `from_mapping`)."""
        return cls.from_mapping(yaml.safe_load(Path(path).read_text()))

    @classmethod
    def from_env(cls) -> "ClusterSpec | None":
        """Loads the spec from EASYRL_CLUSTER, or returns None when it is unset."""
        text = os.environ.get(CLUSTER_ENV)
        if not text:
            return None
        try:
            return cls.from_mapping(json.loads(text))
        except json.JSONDecodeError as err:
            raise ConfigError(f"{CLUSTER_ENV} is not valid JSON: {err}") from err


def assign_shards(sizes: Sequence[tuple[str, int]], num_shards: int) -> dict[str, int]:
    """Assigns variables to PS shards greedily by byte size.

    Largest variable first, each to the currently least-loaded shard (ties: lowest
    shard index; equal sizes: by name), so every role computes the same answer from
    the same variable list with no negotiation.

    Args:
        sizes: (variable name, size in bytes) pairs.
        num_shards: number of PS shards.

    Returns:
        {variable name: shard index}.

    Raises:
        ConfigError: `num_shards` < 1, or a variable name appears twice.
    """
    if num_shards < 1:
        raise ConfigError("number of PS shards must be >= 1")
    counts = Counter(name for name, _ in sizes)
    dups = sorted(name for name, count in counts.items() if count > 1)
    if dups:
        raise ConfigError(f"duplicate variable names for PS shard assignment: {dups}")
    heap = [(0, shard) for shard in range(num_shards)]
    assignment = {}
    for name, size in sorted(sizes, key=lambda item: (-item[1], item[0])):
        load, shard = heapq.heappop(heap)
        assignment[name] = shard
        heapq.heappush(heap, (load + size, shard))
    return assignment
