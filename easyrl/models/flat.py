"""Compiled calls and flat views of variables, what every role's hot path shares: `Compiled`
(a tf.function called through its one concrete function), `FlatLayout` (arrays back to back
in one float32 vector), `FlatVariables` (a fixed list of variables read and assigned as
one vector, what the PS shards and the agents' gradient steps use), `FlatGradients` (one
update's gradients as the flat tensor a gradient step returned) and `GradientStep` (such a
step, which can take the optimizer step into its own call)."""

from collections.abc import Callable, Collection, Sequence

import numpy as np
import tensorflow as tf

from easyrl.aligned import ALIGN, aligned_empty


class Compiled:
    """`fn` as a tf.function with a fixed input signature and AutoGraph off, called through
    its one concrete function's flat entry point: inputs are converted to the signature's
    dtypes (`as_tensor`) and checked against its shapes here, nothing retraces, and a call
    skips both the tf.function dispatch (cache lookup) and the concrete function's argument
    binding (together ~100-250 of the ~500 µs that a small network's call took on these
    cores). Traced on the first call.

    Args:
        fn: the Python function to compile.
        signature: one `tf.TensorSpec` per positional argument.
    """

    def __init__(self, fn, *signature: tf.TensorSpec):
        self.function = tf.function(fn, autograph=False, input_signature=list(signature))
        self.input_signature = self.function.input_signature
        self._specs = [(spec.dtype, spec.shape) for spec in signature]
        self._call = None

    def __call__(self, *args):
        if self._call is None:
            concrete = self.function.get_concrete_function()
            flat_call = getattr(concrete, "_call_flat", None)
            if flat_call is None:  # a TensorFlow without the flat entry point
                self._call = concrete
            else:
                captured = concrete.captured_inputs  # fixed for this trace
                self._call = lambda *tensors: flat_call(list(tensors), captured)
        if len(args) != len(self._specs):
            raise TypeError(f"expected {len(self._specs)} arguments, got {len(args)}")
        tensors = []
        for value, (dtype, shape) in zip(args, self._specs, strict=True):
            tensor = as_tensor(value, dtype)
            if not shape.is_compatible_with(tensor.shape):
                raise ValueError(f"argument of shape {tensor.shape} is not {shape} ({dtype.name})")
            tensors.append(tensor)
        return self._call(*tensors)

    def get_concrete_function(self):
        """The one concrete function (what `easyrl export` saves)."""
        return self.function.get_concrete_function()

    def experimental_get_tracing_count(self) -> int:
        """How many times the function was traced (1 once called)."""
        return self.function.experimental_get_tracing_count()


def as_tensor(value, dtype: tf.DType) -> tf.Tensor:
    """`value` as a tensor of `dtype` for a compiled call: a numpy array of that (numeric)
    dtype through one copy of its own, in memory TensorFlow reads in place (`_shared`);
    anything else through `tf.convert_to_tensor`, which copies an array twice behind ~60 µs
    of dispatch (measured: 64-79 µs against 6-12 µs for a batch of 256 rows)."""
    if not (
        isinstance(value, np.ndarray)
        and value.size
        and value.dtype.kind in "fiu"
        and value.dtype == dtype.as_numpy_dtype
    ):
        return tf.convert_to_tensor(value, dtype)
    copy = aligned_empty(value.nbytes).view(value.dtype).reshape(value.shape)
    np.copyto(copy, value)
    return _shared(copy)


def in_place(array: np.ndarray) -> tf.Tensor:
    """`array` (float32) as a tensor for one compiled call, reading `array`'s own memory where
    TensorFlow can (C-contiguous, writable, on a `ALIGN` boundary: e.g. a request body
    read out of shared memory), else one copy of it (`as_tensor`). The tensor shares memory
    its owner may write again: it lives for the call only (a 21 MB push's Adam step: 12 ms,
    of which converting the gradient took 7)."""
    ready = (
        array.size
        and array.dtype == np.float32
        and array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % ALIGN == 0
    )
    return _shared(array) if ready else as_tensor(array, tf.float32)


def _shared(array: np.ndarray) -> tf.Tensor:
    """A tensor over `array`'s memory (DLPack, no copy); `array` is C-contiguous, writable
    and aligned (unaligned memory would abort the process in the first kernel that reads
    it)."""
    assert array.ctypes.data % ALIGN == 0 and array.flags.c_contiguous
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


class FlatLayout:
    """Arrays of fixed shapes laid out back to back in one flat float32 vector.

    Args:
        shapes: the arrays' shapes, in the order of the flat vector.
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]]):
        self.shapes = [tuple(shape) for shape in shapes]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.offsets = np.cumsum([0, *self.sizes])
        self.size = int(self.offsets[-1])

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        """Splits a flat numpy vector into views of the arrays' shapes."""
        return [
            flat[a:b].reshape(shape)
            for a, b, shape in zip(self.offsets[:-1], self.offsets[1:], self.shapes, strict=True)
        ]

    def concat(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Concatenates the arrays into one flat float32 vector (a view, no copy, when they
        already lie back to back in one buffer: the tensors of one message)."""
        if not arrays:
            return np.zeros(0, np.float32)
        joined = _back_to_back(arrays)
        if joined is not None:
            return joined
        return np.concatenate([np.ravel(a) for a in arrays]).astype(np.float32, copy=False)


class FlatVariables(FlatLayout):
    """A fixed list of float32 variables seen as one flat vector.

    One compiled call reads or assigns all of them: in eager mode every separate
    read or assign costs 0.1-0.3 ms, which dominated the PS and learner hot paths.

    Args:
        variables: the variables, in the order of the flat vector.
    """

    def __init__(self, variables: Sequence[tf.Variable]):
        self.variables = list(variables)
        # A variable's shape is fully defined; TF's annotations allow None dimensions.
        super().__init__([tuple(int(d) for d in v.shape) for v in self.variables])  # pyright: ignore[reportArgumentType]
        flat_spec = tf.TensorSpec([self.size], tf.float32)
        self.read = Compiled(self._read)
        self.assign = Compiled(self._assign, flat_spec)

    def _read(self) -> tf.Tensor:
        if not self.variables:
            return tf.zeros([0], tf.float32)
        return tf.concat([tf.reshape(v, [-1]) for v in self.variables], axis=0)

    def _assign(self, flat: tf.Tensor) -> None:
        for variable, part in zip(self.variables, self.split_tensor(flat), strict=True):
            variable.assign(part)

    def split_tensor(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """Splits a flat tensor into tensors shaped like the variables (inside TF)."""
        parts = tf.split(flat, self.sizes) if self.variables else []
        return [tf.reshape(p, s) for p, s in zip(parts, self.shapes, strict=True)]


class FlatGradients(Sequence):
    """One update's gradients as the one flat tensor an agent's compiled step returned: a
    sequence of numpy arrays in the order of the agent's variables (None for a variable the
    update leaves alone), split from one copy of the tensor on first use (what a push to the
    PS shards sends), while `tensor` stays in TensorFlow, on the device that computed it, for
    a learner that applies its own updates (`easyrl.algorithms.optimizers.LocalOptimizer`):
    no copy to numpy, no check or concatenation in Python.

    Args:
        tensor: the flat float32 gradient, laid out as `layout`.
        layout: the variables' layout (the agent's `FlatVariables`).
        absent: indices of the variables this update leaves alone (their part of `tensor`
            is ignored).
        applied: set when the step that computed them applied them too (`GradientStep.fuse`):
            the boolean tensor that step's optimizer call returned (whether it stepped).
    """

    def __init__(
        self,
        tensor: tf.Tensor,
        layout: FlatLayout,
        absent: Collection[int] = (),
        applied: tf.Tensor | None = None,
    ):
        self.tensor = tensor
        self.layout = layout
        self.absent = frozenset(absent)
        self.applied = applied
        self._arrays: list[np.ndarray | None] | None = None

    def arrays(self) -> list[np.ndarray | None]:
        """The gradients as numpy arrays (views of one copy; None where absent)."""
        if self._arrays is None:
            parts = self.layout.split(np.asarray(self.tensor))
            self._arrays = [None if i in self.absent else a for i, a in enumerate(parts)]
        return self._arrays

    def __len__(self) -> int:
        return len(self.layout.shapes)

    def __getitem__(self, index):  # an int or a slice, as a list's
        return self.arrays()[index]


class GradientStep(Compiled):
    """An agent's compiled gradient step: `fn`'s first output is the flat gradient of the
    agent's variables (`gradients` wraps it as the `FlatGradients` an agent's `learn`
    returns).

    A learner that applies its own updates can `fuse` the optimizer step (and a Polyak step
    of the target networks) into this same call: one TensorFlow call per update instead of
    three, the optimizer's ops scheduled with the step's own (issue 45: the separate apply
    and target calls took 1.5 ms of SAC's ~7.5 ms update inside the learner on 2 cores).

    Args:
        fn: the step; returns (flat gradient, ...).
        signature: one `tf.TensorSpec` per positional argument.
    """

    def __init__(self, fn, *signature: tf.TensorSpec):
        super().__init__(fn, *signature)
        self.fused = False
        """Whether each call applies its gradients (`fuse`)."""
        self.applied: tf.Tensor | None = None
        """After a call of a fused step: whether its optimizer step stepped (None unfused)."""

    def fuse(
        self,
        apply: Callable[[tf.Tensor], tf.Tensor],
        then: Callable[[], object] | None = None,
    ) -> bool:
        """From now on each call also runs `apply(flat gradient)` (a traced optimizer step
        returning whether it stepped, `LocalOptimizer.traced`) and, after it, `then()` (a
        traced update of the target networks); returns whether `then` was given. Retraces
        on the next call.

        Raises:
            ValueError: the step is fused already.
        """
        if self.fused:
            raise ValueError("this gradient step applies its gradients already")
        step = self.function.python_function

        def fused(*args):
            outputs = step(*args)
            applied = apply(outputs[0])
            if then is not None:
                with tf.control_dependencies([applied]):
                    then()
            return (*outputs, applied)

        Compiled.__init__(self, fused, *self.input_signature)
        self.fused = True
        return then is not None

    def __call__(self, *args):
        outputs = super().__call__(*args)
        if not self.fused:
            return outputs
        self.applied = outputs[-1]
        return outputs[:-1]

    def gradients(
        self, flat: tf.Tensor, layout: FlatLayout, absent: Collection[int] = ()
    ) -> FlatGradients:
        """The flat gradient this step returned, laid out as `layout` (the agent's variables,
        read when `learn` runs: BCQ adds its classifier's to DQN's), as `FlatGradients`
        (with `applied` when the step is fused)."""
        return FlatGradients(flat, layout, absent, self.applied)


def _back_to_back(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """One flat float32 view of `arrays` when they are float32 and lie back to back, in this
    order, inside the buffer the first one views (e.g. decoded tensors of one message body);
    else None."""
    start = end = arrays[0].__array_interface__["data"][0]
    for array in arrays:
        contiguous = array.dtype == np.float32 and array.flags.c_contiguous
        if not contiguous or array.__array_interface__["data"][0] != end:
            return None
        end += array.nbytes
    owner = arrays[0]
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if owner.base is None:
        return None
    buffer = np.frombuffer(owner.base, np.uint8)
    offset = start - buffer.__array_interface__["data"][0]
    if offset < 0 or offset + end - start > buffer.nbytes:
        return None
    return buffer[offset : offset + end - start].view(np.float32)
