"""The known differences' types: a failing float32 check explained by a spec's own entry
(KnownDifference), and a library's (LibraryDifference, harness/known_differences.yaml) with
what that library computes (LibraryFormula)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from harness.core.strict import Strict
from harness.optimizers import OPTIMIZER_KINDS
from harness.spec.fields import Name

# A library catalogue entry's keys (harness/known_differences.yaml, harness/library_defects.yaml)
EntryId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=64)]
LibraryName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
Versions = Annotated[str, Field(min_length=1, max_length=64)]  # a PEP 440 specifier set, e.g. ">=0.1"


class KnownDifference(Strict):
    """A failing float32 check that has been investigated and explained. Its verdict becomes
    'known' (the measured error is still recorded); if it stops failing, that is reported
    as a failure, so a stale entry cannot hide anything (like pytest's xfail strict).
    strict: false is for a difference that shows in some runs and not in others (one that
    hides inside a wider envelope on some sizes): a run where it does not show passes.
    `check` names one check; `checks` lists shell-style patterns ("params_after_step_*").
    Math parity (the float64 twins) is never covered: a known float32 effect is rounding."""

    framework: Name
    check: Name | None = None
    checks: list[Annotated[str, Field(pattern=r"^[a-z0-9_*?]+$", max_length=64)]] = []
    devices: list[Literal["cpu", "gpu"]] = ["cpu", "gpu"]
    modes: list[Literal["eager", "fast"]] = ["eager", "fast"]
    strict: bool = True
    reason: Annotated[str, Field(min_length=20)]
    evidence: str = ""

    @model_validator(mode="after")
    def _names_checks(self) -> KnownDifference:
        if (self.check is None) == (not self.checks):
            raise ValueError("check: give one check name (check) or a list of patterns (checks)")
        return self

    @property
    def patterns(self) -> list[str]:
        return [self.check] if self.check else list(self.checks)


class LibraryFormula(Strict):
    """What a library computes where it differs from the spec, for the array-module code to
    compute too (harness/inputs/library.py library_problem). In an entry's `formula` (the library's
    math, float64 too): the oracle computing it is the reference of that framework's float64
    twin, so every other bit of its math stays judged. In `formula` or `float32` (what the
    library does in float32 only): the float32 members computing it measure how far it can
    carry a float32 run from the spec's oracle, the bound of what the entry explains.

    clip_eps: clipping scales by max_norm / (norm + clip_eps); dampening: SGD's momentum
    buffer takes this dampening; running_var: batch norm stores this variance; rates: the
    learning rate of each update is the value this library's schedule computes (optax: in
    float32, from its int32 update count); bias_corrections: Adam's 1 - beta^t in float32
    with beta rounded to float32; loss_sum: the logged loss summed one example after another;
    variance: batch norm's batch variance computed as E[x^2] - E[x]^2 ("fast");
    layer_norm_variance: layer norm's variance over each example's features computed so."""

    clip_eps: Annotated[float, Field(ge=0)] | None = None
    dampening: Annotated[float, Field(ge=0, le=1)] | None = None
    running_var: Literal["unbiased", "biased"] | None = None
    rates: Literal["optax"] | None = None
    bias_corrections: Literal["float32"] | None = None
    loss_sum: Literal["sequential"] | None = None
    variance: Literal["fast"] | None = None
    layer_norm_variance: Literal["fast"] | None = None


class LibraryDifference(KnownDifference):
    """A known difference that belongs to a library rather than to a workload
    (harness/known_differences.yaml), keyed like array-api-tests' xfail files: the
    framework, the library and its version range, the optimizer and loss kinds, device and
    mode. It covers every spec that matches."""

    id: EntryId
    library: LibraryName
    versions: Versions
    optimizers: list[Literal[OPTIMIZER_KINDS]] = list(OPTIMIZER_KINDS)
    losses: list[Literal["mse", "cross_entropy"]] = ["mse", "cross_entropy"]
    # Layer options ("batch_norm.running_var=unbiased"): the entry covers a spec with a layer
    # of that kind and option value (any of them); none listed: every spec.
    layers: list[Annotated[str, Field(pattern=r"^[a-z0-9_]+\.[a-z_]+=[A-Za-z0-9_.-]+$", max_length=64)]] = []
    # The library's formula where it differs from the spec's in float64 too: the twin is
    # judged against the oracle computing it (math_* checks are never covered), and the
    # float32 members computing it bound what the entry explains.
    formula: LibraryFormula | None = None
    # What the library does in float32 only (its float64 twin computes the spec's math): the
    # float32 members computing it bound what the entry explains.
    float32: LibraryFormula | None = None

    # Options of the spec's recipe ("optimizer.clip_global_norm", "loss.label_smoothing"):
    # the entry covers a spec that sets each of them (to anything but none, 0 or false).
    when: list[Annotated[str, Field(pattern=r"^(optimizer|loss)\.[a-z_]+$", max_length=64)]] = []

    @model_validator(mode="after")
    def _bounded(self) -> LibraryDifference:
        if self.formula is None and self.float32 is None:
            raise ValueError(f"{self.id}: give a formula or float32 behaviour: an entry explains a check only as far as members computing it reach")
        if any(p.startswith("math_") for p in self.patterns):
            raise ValueError(f"{self.id}: checks: math parity (math_*) is never covered: give the library's formula instead")
        return self

    def matches_options(self, spec) -> bool:
        """Whether the spec sets every option in `when` and has a layer of `layers` (any; a
        port's layers as its torch module shows them, model.port_options)."""
        if any(not getattr(getattr(spec, section), key, None) for section, key in (w.split(".") for w in self.when)):
            return False
        if not self.layers:
            return True
        options = {f"{layer.kind}.{key}={value}" for layer in spec.model.layers or () for key, value in layer.model_dump().items()}
        options |= set(spec.model.port_options)  # a port's, as its torch module shows them
        return any(selector in options for selector in self.layers)


class LibraryDefect(Strict):
    """A library computing wrong values (harness/library_defects.yaml): no bound explains
    it, so a check it touches still fails, and its diagnosis names it, with the op the
    adapter measured it on (adapters/protocol.py MeasuresDefects) and the mend."""

    id: EntryId
    framework: Name
    library: LibraryName
    versions: Versions
    devices: list[Literal["cpu", "gpu"]] = ["cpu", "gpu"]
    title: Annotated[str, Field(min_length=10, max_length=160)]  # what goes wrong, in one clause
    upstream: Annotated[str, Field(pattern=r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(issues|pull)/[0-9]+$")]
    reason: Annotated[str, Field(min_length=20)]
    evidence: Annotated[str, Field(min_length=20)]
    mend: Annotated[str, Field(min_length=10)]
