"""Keras-glue tests run TensorFlow in the pytest process (single-process cases) and under horovodrun."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
tf.config.experimental.enable_op_determinism()
