"""The library catalogue (harness/known_differences.yaml): the known differences of each
framework's library, loaded and validated once, and which of its entries apply to a spec
on the libraries installed here. The verdict marks the checks they explain
(harness/verdict/diagnosis.py); the calibration computes their formulas and behaviours
(harness/calibrate/roles.py)."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import TypeAdapter, ValidationError

from harness.core.errors import SpecError
from harness.core.paths import KNOWN_DIFFERENCES_FILE, LIBRARY_DEFECTS_FILE
from harness.core.registry import FLOAT64
from harness.spec.known import KnownDifference, LibraryDefect, LibraryDifference, LibraryFormula
from harness.spec.model import Spec
from harness.spec.yamlsafe import Refused, load_yaml


@functools.cache
def library_differences(path: Path = KNOWN_DIFFERENCES_FILE) -> tuple[LibraryDifference, ...]:
    return tuple(_entries(path, LibraryDifference, "known-differences"))


@functools.cache
def library_defects(path: Path = LIBRARY_DEFECTS_FILE) -> dict[str, LibraryDefect]:
    """The library defects by id (harness/library_defects.yaml), validated as the known
    differences are."""
    return {entry.id: entry for entry in _entries(path, LibraryDefect, "library-defects")}


def _entries(path: Path, kind: type, what: str) -> list:
    """A catalogue file's entries of `kind`, each `versions` a PEP 440 specifier set, read
    with the spec's loader (no anchors or aliases, no duplicate keys, bounded depth); a
    one-line SpecError naming the file and the key otherwise."""
    try:
        entries = TypeAdapter(list[kind]).validate_python(load_yaml(path.read_text()) or [])
    except (OSError, Refused, yaml.YAMLError, ValueError, ValidationError) as exc:
        raise SpecError(f"{path}: not a valid {what} file: {_one_line(exc)}") from None
    for entry in entries:
        try:
            SpecifierSet(entry.versions)
        except InvalidSpecifier:
            raise SpecError(f"{path}: {entry.id}: versions: not a version specifier: {entry.versions!r}") from None
    return entries


def _one_line(exc: Exception) -> str:
    """A validation error as one line: each entry's index and key, and what is wrong."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return " ".join(str(exc).split())


def _installed(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def applies(entry: KnownDifference, spec: Spec) -> bool:
    """A spec's own entries always apply; a library entry where its keys match."""
    if not isinstance(entry, LibraryDifference):
        return True
    version = _installed(entry.library)
    return (
        version is not None
        and SpecifierSet(entry.versions).contains(version, prereleases=True)
        and spec.optimizer.kind in entry.optimizers
        and spec.loss.kind in entry.losses
        and entry.matches_options(spec)
    )


def formula_entries(spec: Spec, key) -> list:
    """The library entries with a `formula` (harness/known_differences.yaml) that apply to a
    float64 twin's framework on this spec."""
    return [
        entry
        for entry in library_differences()
        if entry.formula is not None and entry.framework == key.framework and key.device in entry.devices and applies(entry, spec)
    ]


def library_formula(spec: Spec, key) -> LibraryFormula | None:
    """The library formulas that apply to a float64 twin's framework on this spec
    (formula_entries), merged; None where there are none."""
    found: dict = {}
    for entry in formula_entries(spec, key):
        found.update(entry.formula.model_dump(exclude_none=True))
    return LibraryFormula(**found) if found else None


def library_behaviour(spec: Spec, framework: str, keys) -> LibraryFormula | None:
    """What the float32 members standing for `framework`'s library compute (the bound of
    what its entries explain): every applicable entry's `formula` and `float32` behaviour,
    merged, for the entries that match one of its float32 runs in `keys` (device and mode);
    None where none applies."""
    runs = [k for k in keys if k.framework == framework and k.precision != FLOAT64]
    found: dict = {}
    for entry in library_differences():
        if entry.framework != framework or not any(k.device in entry.devices and k.mode in entry.modes for k in runs):
            continue
        if applies(entry, spec):
            for part in (entry.formula, entry.float32):
                if part is not None:
                    found.update(part.model_dump(exclude_none=True))
    return LibraryFormula(**found) if found else None
