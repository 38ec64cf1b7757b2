"""Failing checks that a measured library defect explains (harness/library_defects.yaml):
a float32 run whose adapter measured a catalogued defect in its step (its outcome's
describe["defects"], adapters/protocol.py MeasuresDefects), on a check otherwise put down
to float32 rounding (the float64 twins agree). The check still fails, as the run's values
are wrong; its diagnosis leads with the defect, the op, how far off that op is, the
upstream issue and the mend, and the rounding diagnosis follows."""

from __future__ import annotations

import dataclasses

from harness.core.registry import CheckVerdict
from harness.spec.catalogue import library_defects
from harness.verdict.checks import Check

DEFECT = "library defect"  # how a diagnosis that names a measured defect begins


def _said(label: str, found: list[dict]) -> str:
    catalogue = library_defects()
    parts = []
    for defect in sorted({d["defect"] for d in found}):
        ops = [d for d in found if d["defect"] == defect]
        where = ", ".join(f"{d['op']}: {d['error']:.2g} off" for d in ops[:3]) + (f", and {len(ops) - 3} more" if len(ops) > 3 else "")
        entry = catalogue.get(defect)
        what = f"{entry.title} ({entry.upstream}); mend: {entry.mend}" if entry else "not catalogued"
        parts.append(f"{defect}, measured in {label}'s float32 step ({where}, each relative to the same op in float64): {what}")
    return f"{DEFECT}: {'; '.join(parts)}"


def named(checks: list[Check], outcomes: dict, rounding: str) -> list[Check]:
    """Each failing check whose diagnosis begins with `rounding` (float32 alone differs) and
    one of whose sides met a catalogued defect, diagnosed with that defect first."""
    out = []
    for check in checks:
        sides = [k for k in (check.a, check.b) if k in outcomes and outcomes[k].describe.get("defects")]
        if check.verdict == CheckVerdict.FAIL and sides and (check.diagnosis or "").startswith(rounding):
            said = "; ".join(_said(k.label, outcomes[k].describe["defects"]) for k in sides)
            check = dataclasses.replace(check, diagnosis=f"{said}; {check.diagnosis.removeprefix('rounding: ')}")
        out.append(check)
    return out
