"""A port checked inside a user's own test suite (issue 53), with no pytest import needed:

    from harness.testing import assert_port_matches

    def test_my_port():
        assert_port_matches(torch_model, flax_model, torch_to_flax, data=..., loss="cross_entropy",
                            optimizer={"kind": "sgd", "lr": 0.1}, training={"epochs": 1, "batch_size": 64})

The same arguments as harness.check_port; an AssertionError whose message holds the FAIL
lines, each with its diagnosis, where a check fails; the Verdict where none does."""

from __future__ import annotations

from typing import Any

from harness.port_api import check_port
from harness.result import Verdict

__all__ = ["assert_port_matches"]


def assert_port_matches(torch_model: Any, flax_model: Any, torch_to_flax: Any, **options: Any) -> Verdict:
    """harness.check_port(torch_model, flax_model, torch_to_flax, **options), which must pass."""
    verdict = check_port(torch_model, flax_model, torch_to_flax, **options)
    if not verdict.passed:
        raise AssertionError(f"the port does not match (harness.check_port):\n{verdict}")
    return verdict
