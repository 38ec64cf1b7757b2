"""A multi-framework reproducibility harness for neural-network training.

Importing this package imports no framework: torch, jax and cupy load only when an
adapter runs (see harness.core.registry). From Python (harness/api.py):

    import harness
    verdict = harness.run_spec("specs/peaks_mlp.yaml", profile="quick", frameworks=["torch", "jax"])
    verdict = harness.check_port(torch_model, flax_model, torch_to_flax, data=..., loss=..., optimizer=..., training=...)
"""

from __future__ import annotations

from typing import Any

from harness.core.errors import SpecError

__version__ = "0.1.0"
__all__ = ["SpecError", "Verdict", "check_port", "held_processes", "run_spec"]


def __getattr__(name: str) -> Any:
    """The API's names, imported when first used (the package itself stays light)."""
    if name == "run_spec":
        from harness.api import run_spec

        return run_spec
    if name == "check_port":
        from harness.port_api import check_port

        return check_port
    if name == "held_processes":
        from harness.execute.fresh import held_processes

        return held_processes
    if name == "Verdict":
        from harness.result import Verdict

        return Verdict
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
