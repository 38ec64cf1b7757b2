"""A port checked inside a user's own test suite (issue 53), with no pytest import needed:

    from harness.testing import assert_port_matches

    def test_my_port():
        assert_port_matches(torch_model, flax_model, torch_to_flax, data=..., loss="cross_entropy",
                            optimizer={"kind": "sgd", "lr": 0.1}, training={"epochs": 1, "batch_size": 64})

The same arguments as harness.check_port; an AssertionError whose message holds the FAIL
lines, each with its diagnosis, where a check fails; the Verdict where none does.

`harness_processes`, imported into a test file (or a conftest.py), holds the harness's worker
processes across that file's (or folder's) checks, for the whole pytest session
(harness.held_processes): each imports torch, JAX and the port once, and a check after the
first takes seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from harness.execute.fresh import held_processes
from harness.port_api import check_port
from harness.result import Verdict

__all__ = ["assert_port_matches", "harness_processes"]


def assert_port_matches(torch_model: Any, flax_model: Any, torch_to_flax: Any, **options: Any) -> Verdict:
    """harness.check_port(torch_model, flax_model, torch_to_flax, **options), which must pass."""
    verdict = check_port(torch_model, flax_model, torch_to_flax, **options)
    if not verdict.passed:
        raise AssertionError(f"the port does not match (harness.check_port):\n{verdict}")
    return verdict


try:
    import pytest
except ImportError:  # no pytest: assert_port_matches alone
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session", autouse=True)
    def harness_processes() -> Iterator[None]:
        """The harness's worker processes held across the checks of the tests it is imported
        for, until the session ends (harness.held_processes)."""
        with held_processes():
            yield
