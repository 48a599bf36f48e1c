"""Networks built from the config's `model` section, as plain `tf.Module`s (a custom torso
may be a Keras 3 model, which `KerasTorso` adapts).

Every variable has a stable, explicit name (e.g. "q/torso/0/w") so that all
roles agree on the PS shard assignment and the wire names.
"""

import dataclasses
from collections.abc import Sequence
from typing import Literal, Protocol, cast

import numpy as np
import tensorflow as tf

from easyrl.errors import ConfigError, did_you_mean

ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.nn.tanh, "elu": tf.nn.elu}


def _glorot(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Glorot-uniform values of a dense `(in, out)` or a conv `(k, k, in, out)` kernel."""
    receptive_field = int(np.prod(shape[:-2]))  # 1 for a dense kernel
    limit = np.sqrt(6.0 / (receptive_field * (shape[-2] + shape[-1])))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


class Dense(tf.Module):
    """A dense layer `y = x @ w + b` with Glorot-uniform init and zero bias."""

    def __init__(self, in_dim: int, out_dim: int, name: str, rng: np.random.Generator, scale=1.0):
        super().__init__(name=None)
        w = tf.constant(_glorot((in_dim, out_dim), rng) * scale, tf.float32)
        self.w = tf.Variable(w, name=f"{name}/w")
        self.b = tf.Variable(tf.zeros([out_dim]), name=f"{name}/b")
        self.var_names = (f"{name}/w", f"{name}/b")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, self.w) + self.b  # [B, out]


class MLP(tf.Module):
    """A stack of dense layers with an activation after each one (none after the last
    when `activate_last` is false)."""

    def __init__(
        self,
        in_dim: int,
        sizes: Sequence[int],
        activation: str,
        name: str,
        rng: np.random.Generator,
        activate_last: bool = True,
    ):
        super().__init__(name=None)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")
        dims = [in_dim, *sizes]
        self.layers = [Dense(dims[i], dims[i + 1], f"{name}/{i}", rng) for i in range(len(sizes))]
        self._activation = ACTIVATIONS[activation]
        self._activate_last = activate_last

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self._activate_last or i < len(self.layers) - 1:
                x = self._activation(x)
        return x

    @property
    def var_names(self) -> tuple[str, ...]:
        return tuple(n for layer in self.layers for n in layer.var_names)


class ConvTorso(tf.Module):
    """Convolutions then dense layers, on image frames `[B, H, W, C]`.

    Frames arrive as uint8 (they travel and are stored that way) and are scaled to [0, 1]
    here, inside the network.

    Args:
        obs_shape: (H, W, C).
        conv: (filters, kernel, stride) per convolution.
        hidden: units of the dense layers after the convolutions.
        activation: activation after every layer.
        name: variable name prefix.
        rng: initialisation stream.
        padding: "valid" or "same".
    """

    def __init__(self, obs_shape, conv, hidden, activation, name, rng, padding="valid"):
        super().__init__(name=None)
        if len(obs_shape) != 3:
            raise ValueError(f"a conv torso needs [H, W, C] observations, got {obs_shape}")
        height, width, channels = obs_shape
        self.kernels, self.biases, self.strides = [], [], []
        for i, (filters, kernel, stride) in enumerate(conv):
            init = tf.constant(_glorot((kernel, kernel, channels, filters), rng))
            self.kernels.append(tf.Variable(init, name=f"{name}/conv{i}/w"))
            self.biases.append(tf.Variable(tf.zeros([filters]), name=f"{name}/conv{i}/b"))
            self.strides.append(stride)
            if padding == "same":
                height, width = -(-height // stride), -(-width // stride)
            else:
                height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(f"convolutions {conv} do not fit frames of shape {obs_shape}")
            channels = filters
        self.padding: Literal["VALID", "SAME"] = "SAME" if padding == "same" else "VALID"
        self.flat_dim = height * width * channels
        self.dense = MLP(self.flat_dim, hidden, activation, f"{name}/fc", rng)
        self._activation = ACTIVATIONS[activation]
        self.out_dim = hidden[-1] if hidden else self.flat_dim

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        x = tf.cast(obs, tf.float32) / 255.0  # [B, H, W, C]
        for kernel, bias, stride in zip(self.kernels, self.biases, self.strides, strict=True):
            x = self._activation(tf.nn.conv2d(x, kernel, stride, self.padding) + bias)
        x = tf.reshape(x, [-1, self.flat_dim])  # [B, features]
        return self.dense(x)  # [B, out_dim]


class FlatTorso(tf.Module):
    """An MLP on flat observations (any numeric dtype, cast to float32)."""

    def __init__(self, obs_dim, hidden, activation, name, rng):
        super().__init__(name=None)
        self.mlp = MLP(obs_dim, hidden, activation, name, rng)
        self.out_dim = hidden[-1] if hidden else obs_dim

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        return self.mlp(tf.cast(obs, tf.float32))  # [B, out_dim]


class Torso(Protocol):
    """What `build_torso` returns: a `tf.Module` mapping inputs `[B, *obs_shape]` to float32
    features `[B, out_dim]`."""

    out_dim: int
    """The width of the features."""

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        """Features `[B, out_dim]` of inputs `[B, *obs_shape]`."""
        ...


def build_torso(
    model, obs_shape: tuple[int, ...], name: str, rng: np.random.Generator, parts=()
) -> Torso:
    """The torso the config's `model` section describes, for observations of `obs_shape`.

    With `model.encoders` set, the observations are flattened Dict/Tuple ones and `parts`
    (`easyrl.envs.flat.observation_parts`) says where each key lies: an `EncoderTorso`.

    `model.kind` "mlp" and "conv" are built in. Any other kind is a `package.module:Torso`
    path to a class (or function) of your own, called as `Torso(model, obs_shape, name, rng)`
    with the same arguments as here:

        model      the config's `model` section (read `hidden`, `activation`, ... as you like);
        obs_shape  the shape of one input row, e.g. (4,) or (84, 84, 4) (see the table);
        name       the prefix of every variable name, e.g. "q/torso";
        rng        a numpy Generator to draw initial values from (not TF's random ops), so
                   that every process of a run builds the same initial network.

    It returns either a `tf.Module` or a Keras 3 layer/model (below). A `tf.Module`'s call maps
    inputs `[B, *obs_shape]` (the observation space's dtype: cast them yourself) to float32
    features `[B, out_dim]`, traceable by a `tf.function(autograph=False)`; its `out_dim`
    attribute is that width, and each of its variables is created with an explicit unique
    name under `name/` (e.g. f"{name}/0/w"; `Dense` and `MLP` do this). The algorithm adds its
    heads on top.

    A `keras.Layer` or `keras.Model` (a subclass, or a function returning one; Keras 3, TF
    backend) is wrapped in a `KerasTorso`: it is called once on a batch of zeros
    `[2, *obs_shape]` to build it, then always with float32 inputs and `training=False`. Its
    output must be one float tensor `[B, out_dim]`. Its trainable variables are named
    f"{name}/{i}/{variable}" (i: the index of the layer owning them, in the order of the
    model's `trainable_weights`; e.g. "pi/torso/0/kernel"); the variable objects are Keras's
    own, so the algorithm's updates are what the Keras model computes with. Keras draws the
    initial values with its own initializers, different in every process: that is harmless,
    because every role loads the PS's values (written once by the chief) before it acts or
    learns, and local target networks copy the online ones after that. Non-trainable Keras
    state (a frozen layer, BatchNormalization's moving statistics) is not on the PS and stays
    as each process built it: keep it deterministic. Do not pass `name` on to Keras (it
    refuses "/" in layer names).

    What each algorithm calls it with (`obs`, `act`: the sizes of a flat Box observation and
    action; the algorithms given (obs,) refuse other observation spaces). Local target
    networks build their own torsos, named like the online ones under their own prefix
    ("target/torso", "target_actor/torso", "target_critic/q1/torso"):

        dqn, bcq        "q/torso" (bcq also "bc/torso")    the observation's shape
        impala, a3c     "net/torso"                        the observation's shape
        ppo, a2c, pg    "pi/torso", "vf/torso"             (obs,), float32, normalized when
                                                           normalize_observations is on
        marwil, bc      "pi/torso" (marwil "vf/torso")     (obs,), float32
        es              "policy" (head "policy/out")       (obs,), float32
        td3, ddpg, sac  "actor/torso"                      (obs,), float32
                        "critic/q1/torso", "critic/q2/torso" (ddpg: q1 only)
                                                           (obs + act,): concat(obs,
                                                           action normalized to [-1, 1])

    Returns:
        A module mapping `[B, *obs_shape]` to features `[B, out_dim]` (its `out_dim`).

    Raises:
        ValueError: an unknown kind, an mlp on non-flat observations, a conv on non-image
            ones, or a custom torso that breaks the contract above (the message names the
            path and what is wrong).
        ConfigError: a custom torso's path cannot be imported, or `model.encoders` names a
            key the observations do not have.
    """
    if getattr(model, "encoders", None):
        return EncoderTorso(model, parts, name, rng)
    if ":" in model.kind:
        from easyrl.imports import load_object

        torso = load_object(model.kind, "model.kind")(model, tuple(obs_shape), name, rng)
        if not isinstance(torso, tf.Module):
            import keras

            if isinstance(torso, keras.Layer):
                torso = KerasTorso(torso, tuple(obs_shape), name, model.kind)
        _check_torso(torso, model.kind, name)
        return cast(Torso, torso)
    if model.kind == "conv":
        return ConvTorso(
            obs_shape, model.conv, model.hidden, model.activation, name, rng, model.padding
        )
    if model.kind != "mlp":
        raise ValueError(f"model.kind must be mlp, conv or module:Class, got {model.kind!r}")
    if len(obs_shape) != 1:
        raise ValueError(
            f"model.kind 'mlp' needs flat observations, got shape {obs_shape}; "
            "use model.kind: conv for image frames"
        )
    return FlatTorso(obs_shape[0], model.hidden, model.activation, name, rng)


class EncoderTorso(tf.Module):
    """Per-key encoders of a flattened Dict/Tuple observation (`model.encoders`), then the
    model's torso on their features.

    Each key `model.encoders` lists is cut out of the flat features, reshaped to its own shape
    (kept flat for an mlp encoder) and encoded by the torso its `EncoderConfig` describes
    (variables under `{name}/{key}/`); the other keys pass on flat. The concatenation, in the
    observation's key order, goes through the torso of `model` itself (its kind, hidden, ...;
    variables under `name/`).

    Args:
        model: the config's `model` section (with `encoders`).
        parts: where each top-level key lies in the features (`FlatBox.parts`).
        name: the variable name prefix.
        rng: initialisation stream.

    Raises:
        ConfigError: the observations are not a Dict/Tuple (no `parts`), or an encoder names
            a key they do not have (with the closest one).
    """

    def __init__(self, model, parts, name: str, rng: np.random.Generator):
        super().__init__(name=None)
        if not parts:
            raise ConfigError(
                "model.encoders: the observations are not a Dict or a Tuple; set model.encoders: {}"
            )
        keys = [p.key for p in parts]
        for key in model.encoders:
            if key not in keys:
                raise ConfigError(
                    f"model.encoders.{key}: the observations have no key {key!r}; "
                    + did_you_mean(key, keys, "their keys: " + ", ".join(keys))
                )
        self.parts = tuple(parts)
        self.shapes = {  # what each encoder reads: an mlp the key's flat entries
            p.key: (p.stop - p.start,) if model.encoders[p.key].kind == "mlp" else p.shape
            for p in self.parts
            if p.key in model.encoders
        }
        self.encoders = {
            key: build_torso(model.encoders[key], shape, f"{name}/{key}", rng)
            for key, shape in self.shapes.items()
        }
        width = sum(
            self.encoders[p.key].out_dim if p.key in self.encoders else p.stop - p.start
            for p in self.parts
        )
        self.torso = build_torso(dataclasses.replace(model, encoders={}), (width,), name, rng)
        self.out_dim = self.torso.out_dim

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        obs = tf.cast(obs, tf.float32)  # [B, D]
        features = []
        for part in self.parts:
            x = obs[:, part.start : part.stop]  # [B, size]
            if part.key in self.encoders:
                x = self.encoders[part.key](tf.reshape(x, [-1, *self.shapes[part.key]]))
            features.append(x)
        return self.torso(tf.concat(features, axis=1))  # [B, out_dim]


class KerasTorso(tf.Module):
    """A Keras 3 layer or model as a torso (see `build_torso`): built on a dummy batch,
    called with float32 inputs in inference mode, its trainable variables named under `name/`.

    Keras's variables wrap tf.Variables (`.value`), which the Keras layer reads when called:
    the adapter hands out those very tf.Variables (`named_weights`, found by
    `trainable_variables` and `named_variables`), so that assigning them (FlatVariables,
    PS pulls) changes what the layer computes and a GradientTape differentiates them.

    Args:
        layer: the Keras layer or model.
        obs_shape: the shape of one input row.
        name: the variable name prefix.
        kind: the `model.kind` path, for error messages.

    Raises:
        ValueError: the layer fails on a batch of zeros, or its output is not one float
            tensor `[B, out_dim]`.
    """

    def __init__(self, layer, obs_shape: tuple[int, ...], name: str, kind: str):
        super().__init__(name=None)
        self.layer = layer
        try:
            out = layer(tf.zeros([2, *obs_shape], tf.float32), training=False)
        except Exception as err:  # the user's model: any failure is a contract violation
            raise ValueError(
                f"{kind}: the Keras model fails on a batch of zeros [2, *{obs_shape}]: {err}"
            ) from err
        if not isinstance(out, tf.Tensor):
            raise ValueError(f"{kind}: the Keras model returned {type(out).__name__}, not a tensor")
        shape = tuple(out.shape)
        width = shape[1] if len(shape) == 2 and shape[0] == 2 else None
        if not width:
            raise ValueError(
                f"{kind}: the Keras model must map [B, *{obs_shape}] to features [B, out_dim], "
                f"got shape {shape} for B = 2"
            )
        if not out.dtype.is_floating:
            raise ValueError(f"{kind}: the Keras model's output is {out.dtype.name}, not float")
        self.out_dim = int(width)
        layers: dict[str, int] = {}  # the owning layer's path -> its index
        self.named_weights: dict[str, tf.Variable] = {}
        for weight in layer.trainable_weights:
            index = layers.setdefault(weight.path.rpartition("/")[0], len(layers))
            explicit = f"{name}/{index}/{weight.name}"
            if explicit in self.named_weights:
                raise ValueError(f"{kind}: two variables of one Keras layer are named {explicit!r}")
            self.named_weights[explicit] = weight.value

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        out = self.layer(tf.cast(obs, tf.float32), training=False)  # [B, out_dim]
        return tf.cast(out, tf.float32)


def _check_torso(torso, kind: str, name: str) -> None:
    """Raises ValueError when a custom torso breaks the contract of `build_torso`."""
    if not isinstance(torso, tf.Module):
        raise ValueError(
            f"{kind} returned {type(torso).__name__}, not a tf.Module or a Keras layer"
        )
    out_dim = getattr(torso, "out_dim", None)
    if isinstance(out_dim, bool) or not isinstance(out_dim, int | np.integer) or out_dim < 1:
        raise ValueError(f"{kind}: out_dim must be a positive int, got {out_dim!r}")
    names = [n for n, _ in _named(torso)]
    strays = [n for n in names if not n.startswith(f"{name}/")]
    if strays or len(set(names)) != len(names):
        raise ValueError(
            f"{kind}: every variable needs an explicit unique name under {name + '/'!r}, "
            f"got {sorted(names)}"
        )


def _named(module: tf.Module) -> list[tuple[str, tf.Variable]]:
    """(name, variable) for every trainable variable of `module`: the variable's own name,
    or the name a `KerasTorso` inside gave it."""
    adapters = [m for m in (module, *module.submodules) if isinstance(m, KerasTorso)]
    given = {v.ref(): n for adapter in adapters for n, v in adapter.named_weights.items()}
    return [(given.get(v.ref(), v.name.removesuffix(":0")), v) for v in module.trainable_variables]


def named_variables(module: tf.Module) -> dict[str, tf.Variable]:
    """Returns {explicit name: variable} for every variable of `module`, sorted by name.

    Raises:
        ValueError: two different variables have the same name.
    """
    found: dict[str, tf.Variable] = {}
    for name, variable in _named(module):
        if found.setdefault(name, variable) is not variable:
            raise ValueError(f"two variables are named {name!r}: names must be unique")
    return dict(sorted(found.items()))
