"""Datasets of logged env steps: a directory of compressed npz shards and a schema file.

Layout of a dataset directory (format version 1):

    schema.json            format version, columns {name: {dtype, shape}} (shape per step),
                           env id, observation/action space description, who wrote it
    shard-<actor>-<k>.npz  np.savez_compressed, one array per column, one row per env step

Columns of a step:

    obs          the observation the action was chosen on          [*obs_shape], space dtype
    action       the action the env executed                       int64 (Discrete) or
                                                                   [*shape] space dtype (Box)
    reward       float32
    terminated   bool
    truncated    bool
    next_obs     the true successor (the final observation at an episode end)
    episode      int64, globally unique: actor * 2**40 + the actor's episode counter
    t            int32, the step's index within its episode
    action_logp  float32, log-probability of the action under the behaviour policy
                 (only when the collector exposes `last_action_logp`)

A shard holds whole episodes only: the writer buffers each env's episode until it ends, so
no episode spans two shards; episodes still open at `close` are dropped (and counted).
Shards roll over at `max_file_mb` of (uncompressed) column bytes, so a file never exceeds
the limit unless one episode alone does. Files are written under a temporary name and
renamed, so a reader never sees half a shard.
"""

import json
import re
from pathlib import Path

import numpy as np

from easyrl.atomic import save_npz, write_bytes
from easyrl.errors import ConfigError, EasyRLError

FORMAT_VERSION = 1
"""Version of the dataset layout this module writes and reads."""
SCHEMA_FILE = "schema.json"
"""Name of the schema file in a dataset directory."""
EPISODE_STRIDE = 2**40
"""Episode ids are `actor * EPISODE_STRIDE + the actor's own counter`."""
RECORD_COMMAND = "easyrl train configs/cartpole_record.yaml"
"""How to record the example dataset (quoted by errors about missing datasets)."""

_SHARD = re.compile(r"shard-(\d+)-(\d+)\.npz")


class DatasetError(EasyRLError):
    """A dataset directory is missing, malformed or does not fit the run."""


def describe_space(space) -> dict:
    """A JSON-able description of a gymnasium space (what a dataset must match).

    Raises:
        DatasetError: the space is neither Discrete nor Box.
    """
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name}
    raise DatasetError(f"datasets hold Discrete or Box spaces only, got {space}")


def step_columns(obs_space, action_space, with_logp: bool) -> dict[str, tuple[tuple, np.dtype]]:
    """The columns of one env step, {name: (per-step shape, dtype)} (see the module doc)."""
    obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype))
    if describe_space(action_space)["type"] == "Discrete":
        action = ((), np.dtype(np.int64))
    else:
        action = (tuple(action_space.shape), np.dtype(action_space.dtype))
    scalar = ((), np.dtype(np.float32))
    flag = ((), np.dtype(bool))
    columns = {
        "obs": obs,
        "action": action,
        "reward": scalar,
        "terminated": flag,
        "truncated": flag,
        "next_obs": obs,
        "episode": ((), np.dtype(np.int64)),
        "t": ((), np.dtype(np.int32)),
    }
    if with_logp:
        columns["action_logp"] = scalar
    return columns


def make_schema(env_id: str, obs_space, action_space, with_logp: bool, written_by: dict) -> dict:
    """The schema.json content of a dataset of `env_id` steps."""
    columns = step_columns(obs_space, action_space, with_logp)
    return {
        "format_version": FORMAT_VERSION,
        "env_id": env_id,
        "observation_space": describe_space(obs_space),
        "action_space": describe_space(action_space),
        "columns": {k: {"dtype": d.name, "shape": list(s)} for k, (s, d) in columns.items()},
        "written_by": written_by,
    }


def load_schema(directory: str | Path) -> dict:
    """Reads and checks a dataset's schema.json.

    Raises:
        ConfigError: the directory does not exist (the message gives the record command).
        DatasetError: no schema, unreadable schema, or another format version.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(
            f"input.dir: dataset directory {str(directory)!r} does not exist; record one "
            f"first, e.g. `{RECORD_COMMAND}` (writes data/cartpole), or set input.dir"
        )
    path = directory / SCHEMA_FILE
    try:
        schema = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{directory} holds no {SCHEMA_FILE}: not a dataset") from None
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read {path}: {err}") from err
    if schema.get("format_version") != FORMAT_VERSION:
        raise DatasetError(
            f"{path}: format version {schema.get('format_version')!r}, this easyrl reads "
            f"{FORMAT_VERSION}"
        )
    return schema


def schema_columns(schema: dict) -> dict[str, tuple[tuple, np.dtype]]:
    """{name: (per-step shape, dtype)} of a loaded schema."""
    return {k: (tuple(c["shape"]), np.dtype(c["dtype"])) for k, c in schema["columns"].items()}


def list_shards(directory: str | Path) -> list[Path]:
    """The shard files of a dataset, sorted by (actor, k): the order `read_steps`'s
    `shard_indices` refer to."""
    matches = ((_SHARD.fullmatch(p.name), p) for p in Path(directory).iterdir())
    found = sorted((int(m[1]), int(m[2]), p) for m, p in matches if m)
    return [path for _, _, path in found]


def _shard_name(path: Path) -> tuple[str, str]:
    """(actor, k) as written in the name `shard-<actor>-<k>.npz` of a shard `list_shards` lists."""
    match = _SHARD.fullmatch(path.name)
    if match is None:
        raise DatasetError(f"{path} is not a dataset shard shard-<actor>-<k>.npz")
    return match[1], match[2]


def read_steps(directory: str | Path, shard_indices=None) -> dict[str, np.ndarray]:
    """Reads the rows of (some of) a dataset's shards.

    Args:
        directory: the dataset directory.
        shard_indices: positions in `list_shards(directory)` to read (None: all).

    Returns:
        {column: [rows, *shape] array} with the schema's dtypes, rows sorted by
        (episode, t); empty arrays when no shard is selected.

    Raises:
        DatasetError: a shard's columns, dtypes or shapes differ from the schema, or an
            index is out of range.
    """
    columns = schema_columns(load_schema(directory))
    shards = list_shards(directory)
    if shard_indices is None:
        shard_indices = range(len(shards))
    parts = {name: [np.zeros((0, *shape), dtype)] for name, (shape, dtype) in columns.items()}
    for index in shard_indices:
        if not 0 <= index < len(shards):
            raise DatasetError(f"shard index {index} out of range: {len(shards)} shards")
        with np.load(shards[index]) as data:
            if sorted(data.files) != sorted(columns):
                raise DatasetError(
                    f"{shards[index].name}: columns {sorted(data.files)}, schema has "
                    f"{sorted(columns)}"
                )
            for name, (shape, dtype) in columns.items():
                array = data[name]
                if array.dtype != dtype or array.shape[1:] != shape:
                    raise DatasetError(
                        f"{shards[index].name}: column {name} is {array.dtype}"
                        f"{list(array.shape[1:])}, schema says {dtype}{list(shape)}"
                    )
                parts[name].append(array)
    steps = {name: np.concatenate(arrays) for name, arrays in parts.items()}
    order = np.lexsort((steps["t"], steps["episode"]))
    return {name: array[order] for name, array in steps.items()}


def episode_bounds(steps: dict[str, np.ndarray]) -> np.ndarray:
    """Start rows of the episodes of rows sorted by (episode, t), plus the row count:
    episode j is rows `bounds[j]:bounds[j + 1]`.

    Raises:
        DatasetError: an episode's `t` is not 0, 1, 2, ... (rows missing or duplicated).
    """
    episode = steps["episode"]
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]]) if len(episode) else []
    bounds = np.r_[starts, len(episode)].astype(np.int64)
    expected = np.arange(len(episode)) - np.repeat(bounds[:-1], np.diff(bounds))
    if not np.array_equal(steps["t"], expected):
        raise DatasetError("episodes are not whole: some episode's t is not 0, 1, 2, ...")
    return bounds


def check_dataset(directory: str | Path, env_id: str, obs_space, action_space) -> dict:
    """Checks that a dataset was recorded on this env and these spaces; returns its schema.

    Raises:
        ConfigError: missing directory, or the env id or a space differs from the config's.
        DatasetError: no schema or no shard.
    """
    schema = load_schema(directory)
    recorded = (schema["env_id"], schema["observation_space"], schema["action_space"])
    wanted = (env_id, describe_space(obs_space), describe_space(action_space))
    for what, got, want in zip(("env id", "observation space", "action space"), recorded, wanted):
        if got != want:
            raise ConfigError(
                f"input.dir: dataset {str(directory)!r} was recorded with {what} {got!r}, "
                f"but the config's env (env.id {env_id!r}) has {want!r}"
            )
    if not list_shards(directory):
        raise DatasetError(f"dataset {str(directory)!r} holds no shard files")
    return schema


class DatasetWriter:
    """Writes the steps one actor collects to its own shards `shard-<actor>-<k>.npz`.

    A restarted actor continues after its newest shard (next k, next episode id), so the
    shards of one run never collide.

    Args:
        directory: the dataset directory (created if missing).
        actor: the actor's index.
        num_envs: envs in the actor's vector env.
        schema: the dataset's schema (see `make_schema`), written to schema.json.
        max_file_mb: a shard is written once its rows would pass this size.
    """

    def __init__(self, directory, actor: int, num_envs: int, schema: dict, max_file_mb: float):
        if max_file_mb <= 0:
            raise ValueError(f"max_file_mb must be > 0, got {max_file_mb}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.actor, self.num_envs = actor, num_envs
        self.columns = schema_columns(schema)
        self.max_bytes = max_file_mb * 2**20
        write_bytes(self.directory / SCHEMA_FILE, json.dumps(schema, indent=2).encode())
        own = [p for p in list_shards(self.directory) if _shard_name(p)[0] == str(actor)]
        self.next_shard, next_episode = 0, 0
        if own:
            self.next_shard = int(_shard_name(own[-1])[1]) + 1
            with np.load(own[-1]) as data:
                next_episode = int(data["episode"].max()) % EPISODE_STRIDE + 1
        self._next_episode = actor * EPISODE_STRIDE + next_episode
        self._open: list[list[dict] | None] = [None] * num_envs  # rows of each env's episode
        self._episodes: list[dict[str, np.ndarray]] = []  # finished, not yet written
        self._buffered_bytes = 0
        self.counters = {"written_steps": 0, "written_episodes": 0, "written_shards": 0}
        self.counters["dropped_open_steps"] = 0

    def open_episodes(self, envs: np.ndarray) -> None:
        """Starts recording the next episode of each env in `envs` (call right before the
        episode's first step; an episode already open there is dropped)."""
        for i in np.flatnonzero(envs).tolist():
            self.discard(i)
            self._open[i] = []

    def add(self, obs, action, reward, terminated, truncated, next_obs, action_logp=None) -> int:
        """Adds one vector step (rows of envs not recording are ignored); buffers the
        episodes it ends and writes a shard when the buffer is full.

        Returns:
            The steps of the episodes this call finished.

        Raises:
            DatasetError: an argument does not fit the schema's shapes.
        """
        given = {"obs": obs, "action": action, "reward": reward, "terminated": terminated}
        given.update(truncated=truncated, next_obs=next_obs)
        if "action_logp" in self.columns:
            given["action_logp"] = action_logp
        arrays = {}
        for name, value in given.items():
            shape, dtype = self.columns[name]
            arrays[name] = np.asarray(value).astype(dtype, copy=False)
            if arrays[name].shape != (self.num_envs, *shape):
                raise DatasetError(
                    f"{name} must be [{self.num_envs}, *{list(shape)}], got {arrays[name].shape}"
                )
        finished = 0
        done = arrays["terminated"] | arrays["truncated"]
        for i, rows in enumerate(self._open):
            if rows is None:
                continue
            rows.append({name: a[i] for name, a in arrays.items()})
            if done[i]:
                finished += len(rows)
                self._finish(i, rows)
        return finished

    def _finish(self, env: int, rows: list[dict]) -> None:
        """Closes env `env`'s open episode, whose rows are `rows`, and buffers it."""
        self._open[env] = None
        episode = {name: np.stack([r[name] for r in rows]) for name in rows[0]}
        episode["episode"] = np.full(len(rows), self._next_episode, np.int64)
        episode["t"] = np.arange(len(rows), dtype=np.int32)
        self._next_episode += 1
        size = sum(a.nbytes for a in episode.values())
        if self._episodes and self._buffered_bytes + size > self.max_bytes:
            self.flush()
        self._episodes.append(episode)
        self._buffered_bytes += size

    def discard(self, env: int) -> None:
        """Drops env `env`'s open episode (its envs were reset), counting its steps."""
        rows = self._open[env]
        if rows is not None:
            self.counters["dropped_open_steps"] += len(rows)
            self._open[env] = None

    def flush(self) -> None:
        """Writes the buffered finished episodes as the next shard (nothing when none)."""
        if not self._episodes:
            return
        batch = {k: np.concatenate([e[k] for e in self._episodes]) for k in self.columns}
        path = self.directory / f"shard-{self.actor}-{self.next_shard}.npz"
        save_npz(path, batch, compressed=True)
        self.next_shard += 1
        self.counters["written_steps"] += len(batch["t"])
        self.counters["written_episodes"] += len(self._episodes)
        self.counters["written_shards"] += 1
        self._episodes, self._buffered_bytes = [], 0

    def close(self) -> None:
        """Writes what is buffered; drops (and counts) the episodes still open."""
        self.flush()
        for env in range(self.num_envs):
            self.discard(env)


def check_output_dir(directory: str | Path) -> None:
    """Refuses to record into a directory that already holds shards (another recording
    would mix two runs' data into one dataset).

    Raises:
        ConfigError: naming the directory and what to do.
    """
    directory = Path(directory)
    if directory.is_dir() and list_shards(directory):
        raise ConfigError(
            f"output.dir: {str(directory)!r} already holds a dataset "
            f"({len(list_shards(directory))} shards); remove it or set output.dir to a new "
            "directory"
        )
