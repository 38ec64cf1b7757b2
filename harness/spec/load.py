"""Loading a spec: its YAML parsed with the safe loader, its profile (and a sweep point)
merged in, every profile validated by the model's rules (harness/spec/model.py), and each
error named by file and key path."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.core.errors import SpecError
from harness.core.files import read_regular
from harness.core.paths import SPECS_DIR
from harness.layers import KINDS
from harness.optimizers import OPTIMIZER_KINDS
from harness.spec.model import FULL_PROFILE, Spec
from harness.spec.yamlsafe import Refused, load_yaml

# The largest spec file read: a bound on the pure-Python YAML parser's time, far above the
# shipped specs' sizes (docs/measurements.md).
SPEC_MAX_BYTES = 256 * 1024

# The largest port file read (model.python): a module of a user's own code.
PORT_MAX_BYTES = 1024 * 1024

# The names pydantic gives a plain union's members in an error's location: no spec key.
UNION_TAG = re.compile(r".*[\[\]'\"(].*|constrained-\w+|int|float|str|bool|none")


# The tags of the discriminated unions: data kinds, optimizer kinds and layer kinds.
DISCRIMINATED_TAGS = frozenset(
    {"peaks_grid", "moons", "idx", "image_patterns", "text", "arrays", *OPTIMIZER_KINDS, "constant", "step", "warmup_cosine", *KINDS}
)


# The fields whose value is a discriminated union (a layer's is an item of model.layers).
UNION_FIELDS = frozenset({"data", "optimizer", "schedule"})


def _format_loc(loc: tuple[Any, ...]) -> str:
    # Drop the tags pydantic inserts: a discriminated union's ("data.peaks_grid.noise" ->
    # "data.noise", where the tag follows its field: "step" is a schedule's kind and a key
    # of checks.params_after_steps) and a plain union's members ("training.batch_size.constrained-int").
    parts = []
    for i, p in enumerate(loc):
        after = loc[i - 1] if i else None
        tag = p in DISCRIMINATED_TAGS and (after in UNION_FIELDS or isinstance(after, int))
        if not tag and not UNION_TAG.fullmatch(str(p)):
            parts.append(str(p))
    return ".".join(parts) or "(document)"


def _validation_message(path: Path, err: ValidationError, prefix: str = "") -> str:
    """One line per key (a union's members each say why a value is not theirs: joined)."""
    by_key: dict[str, list[str]] = {}
    for e in err.errors():
        own = _format_loc(e["loc"])
        key = f"{prefix}{own}" if prefix else own
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "missing key"
        elif e["type"] == "union_tag_invalid":  # a kind no member has (the layer kinds, the optimizers, ...)
            ctx = e.get("ctx", {})
            key = f"{key}.kind" if key else "kind"
            msg = f"{ctx.get('tag', '')!r} is none of {str(ctx.get('expected_tags', '')).replace(chr(39), '')}"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            names_its_key = not e["loc"] or msg.startswith((f"{own}.", f"{own}:"))  # "model.layers.2: ...", raised in model
            if names_its_key and ": " in msg:  # a cross-field rule names its own key
                by_key.setdefault("", []).append(f"{prefix}{msg}")
                continue
        by_key.setdefault(f"{key}: ", []).append(msg)
    return "\n".join(f"{path}: {key}{' or '.join(dict.fromkeys(msgs))}" for key, msgs in by_key.items())


def _deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class LoadedSpec(BaseModel):
    """A validated spec with the profile applied, and where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    spec: Spec
    path: Path
    sha256: str
    profile: str
    overrides: dict[str, Any]
    port_sha256: str | None = None  # a port's file (model.python), as it was read

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def port(self) -> Path | None:
        """A port's file (model.python), beside the spec; None for a spec of layers."""
        return None if self.spec.model.python is None else self.path.parent / self.spec.model.python


def parse_document(path: Path, text: str) -> dict[str, Any]:
    try:
        doc = load_yaml(text)
    except Refused as exc:
        raise SpecError(f"{path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:  # where in the file, in the file's own terms
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML: {where}{exc.problem or exc.context or 'not parsed'}") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of more than 4,300 digits
        raise SpecError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: (document): a spec is a mapping of keys, got {type(doc).__name__}")
    return doc


def validate_document(
    path: Path, doc: dict[str, Any], profile: str = FULL_PROFILE, extra: dict[str, Any] | None = None
) -> tuple[Spec, dict[str, Any]]:
    """Validate the document and every profile in it; return the spec with `profile` (and
    `extra`, one point of a sweep) applied, and the overrides that made it."""
    try:
        base = Spec.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(_validation_message(path, exc)) from None
    except (TypeError, ValueError) as exc:  # a non-string key and the like
        raise SpecError(f"{path}: (document): {exc}") from None
    shrunk = {}
    for name, overrides in base.profiles.items():
        if "profiles" in overrides or "name" in overrides:
            raise SpecError(f"{path}: profiles.{name}: a profile may not override 'name' or 'profiles'")
        try:
            shrunk[name] = Spec.model_validate(_deep_merge(doc, overrides))
        except ValidationError as exc:
            raise SpecError(_validation_message(path, exc, prefix=f"profiles.{name}.")) from None
    if profile != FULL_PROFILE and profile not in shrunk:
        known = ", ".join([FULL_PROFILE, *sorted(shrunk)])
        raise SpecError(f"{path}: profile {profile!r} is not defined (known: {known})")
    overrides = base.profiles.get(profile, {})
    if extra:  # one point of a sweep: the profile plus one more override, validated alike
        overrides = _deep_merge(overrides, extra)
        try:
            return Spec.model_validate(_deep_merge(doc, overrides)), overrides
        except ValidationError as exc:
            raise SpecError(_validation_message(path, exc, prefix=f"sweep point {extra}: ")) from None
    return (base, {}) if profile == FULL_PROFILE else (shrunk[profile], overrides)


def sweep_overrides(spec: Spec, values: list[int] | None = None) -> list[dict[str, Any]]:
    """The extra overrides of each point of the spec's sweep (or of the given values),
    e.g. {"data": {"points_per_axis": 10}}."""
    if spec.sweep is None:
        return []
    section, key = spec.sweep.key.split(".")
    return [{section: {key: value}} for value in (values or spec.sweep.values)]


def load_spec(path: str | Path, profile: str = FULL_PROFILE, extra: dict[str, Any] | None = None) -> LoadedSpec:
    path = Path(path)
    raw = read_regular(path, SPEC_MAX_BYTES, "spec file", error=SpecError)  # a link is followed: specs may be linked in
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path}: (document): not UTF-8 text") from None
    spec, overrides = validate_document(path, parse_document(path, text), profile, extra)
    digest = None if spec.model.python is None else hashlib.sha256(port_source(path, spec.model.python)).hexdigest()
    return LoadedSpec(spec=spec, path=path, sha256=hashlib.sha256(raw).hexdigest(), profile=profile, overrides=overrides, port_sha256=digest)


def load_mapping(doc: Any, profile: str = FULL_PROFILE, folder: Path | None = None, what: str = "spec") -> LoadedSpec:
    """A spec given as a mapping in the spec language (the Python API's), validated as a file
    is; named `<what>` in its errors, its port's file (model.python) looked up in `folder`
    (the working folder by default). Its sha256 is its canonical JSON's."""
    path = (folder or Path.cwd()) / f"<{what}>"
    if not isinstance(doc, dict):
        raise SpecError(f"{path.name}: a spec is a mapping of keys (a dict), got {type(doc).__name__}")
    spec, overrides = validate_document(path, doc, profile)
    try:
        canonical = json.dumps(doc, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{path.name}: (document): {exc}") from None
    digest = None if spec.model.python is None else hashlib.sha256(port_source(path, spec.model.python)).hexdigest()
    return LoadedSpec(spec=spec, path=path, sha256=hashlib.sha256(canonical).hexdigest(), profile=profile, overrides=overrides, port_sha256=digest)


def port_source(spec_path: Path, name: str) -> bytes:
    """The bytes of a port's file `name` (model.python), read and never run: a regular file
    in the spec's folder or under it, reached by no link that leads out of it, else
    SpecError naming the spec and the key. Only `harness run` runs it (harness/inputs/port.py)."""
    folder = spec_path.parent
    target = folder / name
    try:
        inside = target.resolve(strict=True).is_relative_to(folder.resolve(strict=True))
    except (OSError, RuntimeError) as exc:  # missing, or a loop of links
        raise SpecError(f"{spec_path}: model.python: {target}: no such file ({getattr(exc, 'strerror', None) or exc})") from None
    if not inside:
        raise SpecError(f"{spec_path}: model.python: {target} leads out of the spec's folder (a link): a port's file lies beside its spec")
    try:
        return read_regular(target, PORT_MAX_BYTES, "port file", error=SpecError)
    except SpecError as exc:
        raise SpecError(f"{spec_path}: model.python: {exc}") from None


def spec_paths(specs_dir: Path = SPECS_DIR) -> dict[str, Path]:
    """Spec name (file stem) -> path, for every YAML file in the specs folder."""
    return {p.stem: p for p in sorted(specs_dir.glob("*.yaml"))}


def resolve_spec(name_or_path: str, specs_dir: Path = SPECS_DIR) -> Path:
    """A spec given by name ("peaks_mlp") or by path ("specs/peaks_mlp.yaml")."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise SpecError(f"{candidate}: no such spec file")
        return candidate
    known = spec_paths(specs_dir)
    if name_or_path not in known:
        raise SpecError(f"unknown spec {name_or_path!r} (known: {', '.join(known) or 'none'})")
    return known[name_or_path]


def json_schema() -> str:
    """The JSON Schema of a spec file, for editors."""
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Reproducibility-harness workload spec"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
