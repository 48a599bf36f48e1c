"""Dict and Tuple observations, flattened at the env boundary, and action masks.

Every env easyrl builds (`easyrl.envs.make_vector_env`, `env_spaces`, and so the actors, the
evaluator, rollout and export) whose observation space is a `gymnasium.spaces.Dict` or
`Tuple` (nested ones too) is wrapped in `FlatObservation`: its observations become one flat
float32 vector, so replay columns, the wire and the PS see a plain `Box` as for any other env.

Layout of the vector (`FlatBox`):

    [ features (gymnasium's `flatten` order: Dict keys sorted, Tuple items in order;
                Discrete parts one-hot)          | action mask (n entries of 0/1) ]

When the top-level Dict has an `action_mask` key (a `MultiBinary(n)`, or a `Box` of shape
`(n,)` holding 0/1, with `n` the size of the env's `Discrete` action space), that mask is
left out of the features and placed last; `FlatBox.mask_size` is n (0: no mask). The
algorithms that honour masks (their spec sets `action_masks`) build their networks
on the features only and never take an action whose entry is 0. `FlatBox.parts` says where
each top-level key of the features lies (and its own shape), so that `model.encoders` can
give keys encoders of their own (`easyrl.models.EncoderTorso`).
"""

from typing import NamedTuple

import gymnasium
import numpy as np
from gymnasium import spaces

from easyrl.errors import ConfigError, EasyRLError

MASK_KEY = "action_mask"
"""The top-level Dict key of an observation's action mask."""


class Part(NamedTuple):
    """Where one top-level key of a Dict/Tuple observation lies in the flat vector."""

    key: str
    """The Dict key, or the Tuple index as a string ("0", "1", ...)."""
    shape: tuple[int, ...]
    """Its shape: a Box's own (its entries lie in C order), else (its flattened size,)."""
    start: int
    """Its first entry in the vector."""
    stop: int
    """One past its last entry."""


class FlatBox(spaces.Box):
    """The float32 `Box` of a flattened Dict/Tuple observation (see the module docstring).

    Args:
        low, high: bounds `[D]` of the whole vector (the mask's entries in [0, 1]).
        mask_size: n, the action-mask entries at the end of the vector (0: none).
        parts: where each top-level key of the features lies, in the vector's order.
        features: the Dict/Tuple space of the features (the observation space without its
            `action_mask`), which `flatten_observation` flattens by.
    """

    def __init__(
        self,
        low: np.ndarray,
        high: np.ndarray,
        mask_size: int,
        parts=(),
        features: spaces.Dict | spaces.Tuple | None = None,
    ):
        super().__init__(low, high, dtype=np.float32)
        self.mask_size = int(mask_size)
        """Entries of the action mask at the end of the vector (0: no mask)."""
        self.parts: tuple[Part, ...] = tuple(parts)
        """Where each top-level key of the features lies (`model.encoders` reads them)."""
        self.features = features
        """The Dict/Tuple space of the features, mask left out (None: not known)."""


def action_mask_size(space: spaces.Space) -> int:
    """n, the action-mask entries at the end of observations of `space` (0: none)."""
    return space.mask_size if isinstance(space, FlatBox) else 0


def observation_parts(space: spaces.Space) -> tuple[Part, ...]:
    """Where the top-level keys of a flattened Dict/Tuple observation space lie (`FlatBox.parts`);
    () for any other space."""
    return space.parts if isinstance(space, FlatBox) else ()


def _parts(features: spaces.Dict | spaces.Tuple) -> tuple[Part, ...]:
    """Where each top-level key of `features` lies in its flattened vector."""
    items = (
        features.spaces.items()
        if isinstance(features, spaces.Dict)
        else ((str(i), space) for i, space in enumerate(features.spaces))
    )
    parts, start = [], 0
    for key, space in items:
        size = int(spaces.flatdim(space))
        shape = tuple(space.shape) if isinstance(space, spaces.Box) else (size,)
        parts.append(Part(str(key), shape, start, start + size))
        start += size
    return tuple(parts)


def legal_actions(obs: np.ndarray, mask_size: int) -> np.ndarray:
    """The mask of a batch of flat observations `[N, D]` as bools `[N, n]`.

    Raises:
        EasyRLError: a row has no legal action (the env must always leave one).
    """
    legal = np.asarray(obs)[:, -mask_size:] > 0.5  # [N, n]
    if not legal.any(axis=1).all():
        raise EasyRLError(f"an observation's {MASK_KEY} has no legal action (all entries 0)")
    return legal


def _mask_space(space: spaces.Space, action_space: spaces.Space) -> int:
    """The size n of an `action_mask` space, checked against the action space.

    Raises:
        ConfigError: the mask is not MultiBinary(n) or a 0/1 Box `(n,)`, or the action space
            is not Discrete(n).
    """
    if isinstance(space, spaces.MultiBinary) and len(space.shape) == 1:
        n = int(space.shape[0])
    elif (
        isinstance(space, spaces.Box)
        and len(space.shape) == 1
        and np.all(space.low >= 0)
        and np.all(space.high <= 1)
    ):
        n = int(space.shape[0])
    else:
        raise ConfigError(
            f"env: the observation's {MASK_KEY!r} must be MultiBinary(n) or a Box (n,) of 0/1, "
            f"got {space}"
        )
    if not isinstance(action_space, spaces.Discrete) or int(action_space.n) != n:
        raise ConfigError(
            f"env: an observation's {MASK_KEY!r} of {n} entries needs a Discrete({n}) action "
            f"space, got {action_space}"
        )
    return n


class FlatObservation(gymnasium.ObservationWrapper):
    """Flattens a Dict/Tuple observation to a `FlatBox` vector (see the module docstring).

    Raises:
        ConfigError: the observation space is not a Dict or Tuple, the action mask is
            malformed (see `_mask_space`), or nothing but the mask is observed.
    """

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Dict | spaces.Tuple):
            raise ConfigError(f"FlatObservation wraps Dict or Tuple observations, got {space}")
        self.mask_size = 0
        self.features: spaces.Dict | spaces.Tuple = space
        if isinstance(space, spaces.Dict) and MASK_KEY in space.spaces:
            self.mask_size = _mask_space(space[MASK_KEY], env.action_space)
            rest = {k: v for k, v in space.spaces.items() if k != MASK_KEY}
            if not rest:
                raise ConfigError(f"env: the observation has nothing but its {MASK_KEY!r}")
            self.features = spaces.Dict(rest)
        flat = spaces.flatten_space(self.features)
        assert isinstance(flat, spaces.Box), flat  # Dict/Tuple of Box/Discrete/MultiBinary...
        ones = np.ones(self.mask_size)
        low = np.concatenate([flat.low, 0 * ones]).astype(np.float32)
        high = np.concatenate([flat.high, ones]).astype(np.float32)
        parts = _parts(self.features)
        self.flat_space = FlatBox(low, high, self.mask_size, parts, self.features)
        self.observation_space = self.flat_space

    def observation(self, observation) -> np.ndarray:
        """The flat float32 vector `[D]` of one observation: features, then the mask."""
        return flatten_observation(self.flat_space, observation)


def flatten_observation(space: FlatBox, observation) -> np.ndarray:
    """The flat float32 vector `[D]` of one Dict/Tuple observation of the space `space` was
    flattened from (what `FlatObservation` observes): features, then the mask.

    Raises:
        EasyRLError: `space` does not know its features' space.
    """
    if space.features is None:
        raise EasyRLError("this FlatBox does not know the Dict/Tuple space it flattens")
    if not space.mask_size:
        return np.asarray(spaces.flatten(space.features, observation), np.float32)
    rest = {k: v for k, v in observation.items() if k != MASK_KEY}
    features = np.asarray(spaces.flatten(space.features, rest), np.float32)  # [D - n]
    mask = np.asarray(observation[MASK_KEY], np.float32).reshape(-1)  # [n]
    return np.concatenate([features, mask])


def flat_env(env: gymnasium.Env) -> gymnasium.Env:
    """`env` wrapped in `FlatObservation` when its observations are a Dict or a Tuple."""
    if isinstance(env.observation_space, spaces.Dict | spaces.Tuple):
        return FlatObservation(env)
    return env
