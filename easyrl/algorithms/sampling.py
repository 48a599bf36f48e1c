"""Sampling a categorical policy by Gumbel-max (IMPALA's and PPO's acting).

    a = argmax_k(logits_k + g_k),  g_k ~ Gumbel(0, 1) i.i.d.   is distributed as softmax(logits)

The noise is drawn on the actor from its numpy rng (`gumbel_noise`, reproducible), the argmax
runs inside the acting step's compiled function (`gumbel_max`). An illegal action's logit is
`masking.ILLEGAL` (-1e9): it never wins against a legal one, whose logit is finite and small.
"""

import numpy as np
import tensorflow as tf


def gumbel_noise(rng: np.random.Generator, shape: tuple[int, int], dtype) -> np.ndarray:
    """Gumbel(0, 1) noise `[N, A]` from `rng`, as `dtype` (the precision of the sum in
    `gumbel_max`)."""
    return rng.gumbel(size=shape).astype(dtype, copy=False)


def gumbel_max(logits: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
    """Sampled actions `[N]` int64: argmax of `logits` `[N, A]` plus `noise` `[N, A]`, summed
    in the noise's dtype."""
    return tf.argmax(tf.cast(logits, noise.dtype) + noise, axis=1)
