"""Action masks in TensorFlow: the features and the legal actions of flat observations.

An env whose Dict observation has an `action_mask` is observed as a flat vector whose last
n entries are the mask (`easyrl.envs.flat`). The networks of the algorithms that honour
masks (`action_masks` in their spec: DQN, IMPALA, A3C, PPO, A2C, PG) take the
features only, `features(obs, n)`; the mask never reaches them as input. Their logits or Q
values of illegal actions are replaced by `ILLEGAL` before any argmax, sample, softmax or
entropy: a finite value, so that 0 * log p stays 0 (no NaN) and `tf.where` gives the
replaced entries a zero gradient.
"""

import tensorflow as tf

ILLEGAL = -1e9
"""The logit (or Q value, for an argmax) given to an illegal action: exp(ILLEGAL - max) is 0
in float32, and ILLEGAL stays finite through any sum with a real logit."""


def _split(obs: tf.Tensor, mask_size: int) -> list[tf.Tensor]:
    """(features `[..., D - n]`, mask `[..., n]`) of observations `[..., D]` (static D)."""
    width = obs.shape[-1]
    assert width is not None, "flat observations of a static width"
    return tf.split(obs, [width - mask_size, mask_size], axis=-1)


def features(obs: tf.Tensor, mask_size: int) -> tf.Tensor:
    """Observations `[..., D]` without their last `mask_size` entries `[..., D - n]`."""
    return _split(obs, mask_size)[0] if mask_size else obs


def masked(values: tf.Tensor, obs: tf.Tensor, mask_size: int) -> tf.Tensor:
    """`values` `[..., n]` (logits or Q values) with the entries that the mask at the end of
    `obs` `[..., D]` marks illegal (0) replaced by `ILLEGAL`; unchanged without a mask."""
    if not mask_size:
        return values
    legal = _split(obs, mask_size)[1] > 0.5  # [..., n]
    return tf.where(legal, values, tf.cast(ILLEGAL, values.dtype))
