"""What differs between the stack rows, for tests and the scripts they launch: the Keras major version, the
names Keras gives variables, and the one layer a test needs that Keras 3 dropped (virtual batches in
BatchNormalization). Importable without pytest (rank scripts import it)."""

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on the tf2.21 row)
from hvd_sched._compat import keras_major

__all__ = ["KERAS_MAJOR", "keras2_only", "variable_name", "batch_normalization", "names_pattern"]

#: 2 on the tf2.15 and tf2.21 rows, 3 on the keras3 row.
KERAS_MAJOR = keras_major()


def keras2_only(reason):
    """A pytest mark skipping a test on Keras 3, where what it exercises does not exist."""
    import pytest

    return pytest.mark.skipif(KERAS_MAJOR != 2, reason=f"Keras 3: {reason}")


def variable_name(variable):
    """The name hvd_sched's per-variable rules match: Keras 2 `name` ("dense/bias:0"), Keras 3 `path`
    ("sequential/dense/bias")."""
    return variable.path if KERAS_MAJOR == 3 else variable.name


def names_pattern(*leaves):
    """A regex for the list of variable names an error message prints, e.g. names_pattern("kernel", "bias")."""
    one = (r"[\w/]*dense[\w/]*/{}" if KERAS_MAJOR == 3 else r"dense[\w/]*/{}:0")
    return r"\[" + ", ".join("'" + one.format(leaf) + "'" for leaf in leaves) + r"\]"


def batch_normalization(virtual_batch_size=None, **kwargs):
    """BatchNormalization whose training statistics are those of each `virtual_batch_size` rows, interleaved
    (virtual batch k holds rows k, k + V, k + 2V, ... of a batch, V = batch / virtual_batch_size), as Keras 2's
    `virtual_batch_size` computes them: what rank k of V holds when each rank takes every V-th row."""
    import tensorflow as tf

    if KERAS_MAJOR == 2:
        return tf.keras.layers.BatchNormalization(virtual_batch_size=virtual_batch_size, **kwargs)
    if virtual_batch_size is None:
        return tf.keras.layers.BatchNormalization(**kwargs)
    return _virtual_batch_norm_class()(virtual_batch_size, **kwargs)


_CLASS = []


def _virtual_batch_norm_class():
    """Keras 3 has no virtual batches: the same statistics, written for the tests (Keras 3 only)."""
    if _CLASS:
        return _CLASS[0]
    import keras
    from keras import ops

    class VirtualBatchNormalization(keras.layers.BatchNormalization):
        def __init__(self, virtual_batch_size, **kwargs):
            super().__init__(**kwargs)
            self.virtual_batch_size = virtual_batch_size

        def call(self, inputs, training=None, mask=None):
            if not training:
                return super().call(inputs, training=False)
            shape = ops.shape(inputs)
            groups = shape[0] // self.virtual_batch_size
            # [B, ...] -> [vbs, B / vbs, ...], moments over the first axis: group k is rows k, k + B / vbs, ...
            grouped = ops.reshape(inputs, (self.virtual_batch_size, groups, *shape[1:]))
            axes = [0] + list(range(2, len(grouped.shape) - 1))  # all but the groups and the channels
            mean = ops.mean(grouped, axis=axes, keepdims=True)
            variance = ops.var(grouped, axis=axes, keepdims=True)
            normed = (grouped - mean) / ops.sqrt(variance + self.epsilon)
            outputs = ops.reshape(normed * self.gamma + self.beta, shape)
            # Moving statistics: the mean over the virtual batches of their moments (not compared by the tests).
            self.moving_mean.assign(self.moving_mean * self.momentum +
                                    ops.mean(ops.reshape(mean, (-1, shape[-1])), axis=0) * (1 - self.momentum))
            self.moving_variance.assign(self.moving_variance * self.momentum +
                                        ops.mean(ops.reshape(variance, (-1, shape[-1])), axis=0) *
                                        (1 - self.momentum))
            return outputs

    _CLASS.append(VirtualBatchNormalization)
    return VirtualBatchNormalization
