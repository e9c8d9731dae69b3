"""Version of hvd_sched (read by setup.py without importing the package)."""

__version__ = "0.1.0"
