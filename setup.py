"""Packaging for hvd_sched: Detectron's solver schedule for Keras on Horovod."""

import pathlib
import re

from setuptools import find_packages, setup

_HERE = pathlib.Path(__file__).parent
_VERSION = re.search(r'__version__ = "([^"]+)"', (_HERE / "hvd_sched" / "_version.py").read_text()).group(1)

# The pinned training stack lives in scripts/versions.env and is installed by scripts/install.sh (Horovod must be
# built from source against the installed TensorFlow, which pip's resolver cannot do). These are the versions
# hvd_sched.keras is tested with, one set per row of the support matrix (STACKS in versions.env; the unsuffixed
# names are the default row, NAME_<ROW> another row's; a pin a row leaves empty has no constant);
# tests/test_versions.py asserts they agree with versions.env and docker/.
TENSORFLOW_VERSION = "2.15.1"
HOROVOD_VERSION = "0.28.1"
TENSORFLOW_VERSION_TF2_20 = "2.20.0"
TF_KERAS_VERSION_TF2_20 = "2.20.1"
KERAS_VERSION_TF2_20 = "3.15.1"
TENSORFLOW_VERSION_KERAS3 = "2.20.0"
KERAS_VERSION_KERAS3 = "3.15.1"
# The rows' Pythons: 3.11 (tf2.15), 3.12 (tf2.20 and keras3). TensorFlow 2.15 needs numpy<2; 2.20 takes numpy 2.
_PY311 = "python_version < '3.12'"
_PY312 = "python_version >= '3.12'"

setup(
    name="hvd_sched",
    version=_VERSION,
    description="Detectron's solver (warmup, steps, momentum correction, LR multipliers) for Keras on Horovod",
    long_description=(_HERE / "README.md").read_text() if (_HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["hvd_sched", "hvd_sched.*"]),
    install_requires=[f"numpy<2; {_PY311}", f"numpy>=1.26,<3; {_PY312}", "PyYAML>=5.4"],
    extras_require={
        # The Keras glue; Horovod itself comes from scripts/install.sh (built against this TensorFlow).
        # `keras`: rows tf2.15 and tf2.20 (Keras 2 as tf.keras); tf2.20 also needs TF_USE_LEGACY_KERAS=1 in the
        # environment (tf.keras is Keras 3 otherwise). `keras3`: row keras3, Keras 3 as tf.keras
        # (TF_USE_LEGACY_KERAS unset); Python 3.12 only.
        "keras": [f"tensorflow-cpu=={TENSORFLOW_VERSION}; {_PY311}",
                  f"tensorflow-cpu=={TENSORFLOW_VERSION_TF2_20}; {_PY312}",
                  f"tf-keras=={TF_KERAS_VERSION_TF2_20}; {_PY312}",
                  f"keras=={KERAS_VERSION_TF2_20}; {_PY312}"],
        "keras3": [f"tensorflow-cpu=={TENSORFLOW_VERSION_KERAS3}; {_PY312}",
                   f"keras=={KERAS_VERSION_KERAS3}; {_PY312}"],
        "plot": ["matplotlib>=3.7"],
        "test": ["pytest>=7", "hypothesis>=6", "scikit-learn>=1.3", "matplotlib>=3.7", "pytest-timeout>=2"],
    },
    entry_points={"console_scripts": ["hvd-sched=hvd_sched.cli:main"]},
)
