"""What a lease brought back, into the results folder (issue 51): the records in
`records.tar.gz`, the archive tools/device-run.sh leaves in $OUT, each checked before any is
written (python3 tools/device_records.py ARCHIVE [--into results] [--folder results-device]).

- The archive is read, never extracted. Only regular members named FOLDER/SPEC/FILE are
  taken, FILE a record's or an artifact's name (harness/records/write.py RECORD_NAME), each
  within the size a record or an artifact may have. Every other member (a link, a device, an
  absolute path, '..', another folder such as results-device-cpu-references/) is left out
  and said.
- Each record is validated against the schema; its spec's name must be its folder's and its
  file name the one the harness gives it; its artifact must be in the archive, with the
  sha256 the record names, and a plain .npz (nothing unpickled).
- A file already in the results folder with the same bytes is left as it is; one with other
  bytes stops everything. Only then is anything written, each artifact before its record,
  never over a file (harness/core/atomic.py, exclusive).

Exit 0; 2 for bad input, with one line naming the archive and the member, and nothing
written."""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, as the other tools

from harness.core.atomic import atomic_write  # noqa: E402
from harness.core.errors import HarnessError, RecordError  # noqa: E402
from harness.records.schema import Record  # noqa: E402
from harness.records.store import ARTIFACT_MAX_BYTES, RECORD_MAX_BYTES, artifact_arrays, parse_record  # noqa: E402
from harness.records.write import RECORD_NAME, record_path  # noqa: E402

SPEC_FOLDER = re.compile(r"[a-z][a-z0-9_]*")  # a spec's name (harness/spec/fields.py Name)


def members(archive: Path, folder: str) -> tuple[dict[tuple[str, str], bytes], list[str]]:
    """The record and artifact files under `folder` in the archive, by (spec, file name),
    and the names of the members left out."""
    taken: dict[tuple[str, str], bytes] = {}
    left: list[str] = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                parts = member.name.split("/")
                if member.isdir() and parts[0] == folder and len(parts) <= 2:
                    continue
                if not (
                    member.isreg() and len(parts) == 3 and parts[0] == folder and SPEC_FOLDER.fullmatch(parts[1]) and RECORD_NAME.fullmatch(parts[2])
                ):
                    left.append(member.name)
                    continue
                limit = RECORD_MAX_BYTES if parts[2].endswith(".json") else ARTIFACT_MAX_BYTES
                if member.size > limit:
                    raise RecordError(f"{archive}: {member.name}: {member.size:,} bytes, more than the {limit:,} it may have")
                taken[parts[1], parts[2]] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise RecordError(f"{archive}: not a readable .tar.gz: {exc}") from None
    return taken, left


def checked(archive: Path, taken: dict[tuple[str, str], bytes]) -> tuple[list[tuple[str, str]], list[Record]]:
    """The files to write (each record's artifact before it) and the records, every one
    checked; a RecordError naming the member otherwise."""
    files: list[tuple[str, str]] = []
    records: list[Record] = []
    for (spec, name), raw in sorted(taken.items()):
        if not name.endswith(".json"):
            continue
        where = f"{archive}: {spec}/{name}"
        record = parse_record(raw, where)
        own = record_path(Path(), record).name
        if record.spec.name != spec or own != name:
            raise RecordError(f"{where}: the record is {record.spec.name}'s {own}, not this file")
        if record.artifacts is not None:
            payload = taken.get((spec, record.artifacts.file))
            if payload is None:
                raise RecordError(f"{where}: its artifact {record.artifacts.file} is not in the archive")
            artifact_arrays(payload, record, f"{where}: its artifact {record.artifacts.file}", RecordError)
            files.append((spec, record.artifacts.file))
        files.append((spec, name))
        records.append(record)
    return files, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/device_records.py", description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path, help="records.tar.gz, as a lease brought it back")
    parser.add_argument("--into", type=Path, default=ROOT / "results", help="the results folder (default: the checkout's results/)")
    parser.add_argument("--folder", default="results-device", help="the archive's folder to take (default results-device)")
    args = parser.parse_args(argv)
    try:
        taken, left = members(args.archive, args.folder)
        files, records = checked(args.archive, taken)
        if not records:
            raise RecordError(f"{args.archive}: no record under {args.folder}/")
        unused = sorted(f"{args.folder}/{spec}/{name}" for spec, name in set(taken) - set(files))
        new, there = [], 0
        for spec, name in files:
            path = args.into / spec / name
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise RecordError(f"{path}: not a regular file; nothing written")
            if not path.exists():
                new.append((path, taken[spec, name]))
            elif path.read_bytes() == taken[spec, name]:
                there += 1
            else:
                raise RecordError(f"{path}: already there with other bytes than {args.archive}'s {args.folder}/{spec}/{name}; nothing written")
        for path, payload in new:
            atomic_write(path, payload, mode="exclusive")
    except HarnessError as exc:
        print(f"tools/device_records.py: {exc}", file=sys.stderr)
        return 2
    devices = Counter(r.device.kind for r in records)
    specs = ", ".join(sorted({r.spec.name for r in records}))
    where = ", ".join(f"{n} on {kind}" for kind, n in sorted(devices.items()))
    print(f"{len(records)} record(s) of {specs} ({where}): {len(new)} file(s) written under {args.into}, {there} already there")
    folders = Counter(name.split("/")[0] for name in left if _other_folder(name, args.folder))
    for folder, n in sorted(folders.items()):
        print(f"left out: {folder}/ ({n} member(s): not --folder's)")
    for name in [*(n for n in left if not _other_folder(n, args.folder)), *unused]:
        print(f"left out: {name if name.isprintable() else ascii(name)}")  # a name never writes control characters
    return 0


def _other_folder(name: str, folder: str) -> bool:
    """A member of another plain top folder (said once for all its members); any other left
    out is said by its own name."""
    parts = name.split("/")
    return parts[0] != folder and re.fullmatch(r"[\w-][\w.-]*", parts[0]) is not None and ".." not in parts


if __name__ == "__main__":
    sys.exit(main())
