"""Keras-glue tests run TensorFlow in the pytest process (single-process cases) and under horovodrun."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
tf.config.experimental.enable_op_determinism()


@pytest.fixture(scope="module")
def horovod():
    """`horovod.tensorflow`, initialised (one process: size 1), for the tests of the distributed optimizer's API."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


@pytest.fixture
def mixed_float16():
    """The mixed_float16 policy for one test, the previous policy restored after it."""
    policy = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    tf.keras.mixed_precision.set_global_policy(policy)
