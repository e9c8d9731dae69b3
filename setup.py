# Metadata, version and packages are in pyproject.toml; this file only lets pips without PEP 660 `pip install -e .`.
from setuptools import setup
setup()
