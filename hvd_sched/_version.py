"""Version of hvd_sched (pyproject.toml reads it without importing the package)."""

__version__ = "0.1.0"
"""The version of hvd_sched (PEP 440)."""
