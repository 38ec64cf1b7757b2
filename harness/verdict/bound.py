"""A check's tolerance as fields, one definition for the check (harness/verdict/checks.py)
and its record (harness/records/schema.py). Nothing of the runs is imported here: the
records, and the tables that render them, reach it without reaching a run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ConfigDict


@dataclass(frozen=True)
class Bound:
    """A check's tolerance as fields, where its error is largest: `allowed` is factor *
    spread + floor (calibrated), or atol + rtol * |b| (the spec's allclose override), or rtol
    (the spec's horizon rule); the error over `allowed` is the check's ratio. The record
    keeps it as it is (harness/records/schema.py, CheckRecord.bound)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    rule: str  # the rule that made the check (harness/verdict/rules.py)
    measure: str  # allclose, tensor_l2, relative_curve, max_abs, relative
    allowed: float | None = None
    factor: float | None = None
    spread: float | None = None  # the calibration members' largest distance there
    floor: float | None = None
    rtol: float | None = None
    members: int | None = None  # how many rounding-only runs the spread was measured over
    dtype: str | None = None


def times_tolerance(ratio: float, whose: str = "its tolerance") -> str:
    """A check's error over its tolerance as every line says it: "2.5x its tolerance"; "no
    difference" where the error is zero (not "0x"); "its tolerance is zero" where the ratio
    is infinite."""
    if ratio == 0:
        return "no difference"
    if math.isinf(ratio):
        return f"{whose} is zero"
    return f"{ratio:.3g}x {whose}"
