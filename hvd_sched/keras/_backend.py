"""The Keras internals of the running Keras major version: `_keras2` or `_keras3`, picked once at import.

`hvd_sched._compat.keras_major()` applies TensorFlow's own rule (TF >= 2.16 without TF_USE_LEGACY_KERAS=1 makes
`tf.keras` Keras 3). Both modules export the same names (`_keras2.__all__`; tests/keras/test_hooks.py checks it);
the public modules of `hvd_sched.keras` reach Keras' internals only through these.
"""

from .. import _compat

if _compat.keras_major() == 3:
    from ._keras3 import *  # noqa: F401,F403
    from ._keras3 import __all__  # noqa: F401
else:
    from ._keras2 import *  # noqa: F401,F403
    from ._keras2 import __all__  # noqa: F401
