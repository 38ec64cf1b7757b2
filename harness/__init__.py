"""A multi-framework reproducibility harness for neural-network training.

Importing this package imports no framework: torch, jax and cupy load only when an
adapter runs (see harness.core.registry).
"""

__version__ = "0.1.0"
