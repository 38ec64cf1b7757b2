"""tools/device_records.py: a lease's records.tar.gz into the results folder, every record and
artifact checked before any file is written, the archive never extracted."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.records.store import load_records
from tests.conftest import ROOT
from tests.test_report import fake

TOOL = ROOT / "tools" / "device_records.py"


def ingest(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def records(tmp_path: Path) -> Path:
    """A lease's folders: two GPU records and a CPU one in results-device/, with their
    artifacts, and a record in results-device-cpu-references/."""
    fake(tmp_path / "results-device", "peaks_mlp", "torch", "gpu")
    fake(tmp_path / "results-device", "peaks_mlp", "jax", "gpu")
    fake(tmp_path / "results-device", "mnist_mlp", "torch")
    fake(tmp_path / "results-device-cpu-references", "peaks_mlp", "numpy")
    return tmp_path / "results-device"


def pack(tmp_path: Path, extra=()) -> Path:
    """records.tar.gz as tools/device-run.sh packs them (`tar -czf ... -C parent results-device
    results-device-cpu-references`), with `extra` (TarInfo, bytes) members after them."""
    path = tmp_path / "records.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for folder in ("results-device", "results-device-cpu-references"):
            tar.add(tmp_path / folder, arcname=folder)
        for info, payload in extra:
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def archive_of(tmp_path: Path, extra=()) -> Path:
    records(tmp_path)
    return pack(tmp_path, extra)


def test_a_leases_records_land_in_the_results_folder_once(tmp_path):
    archive = archive_of(tmp_path)
    results = tmp_path / "results"
    done = ingest(archive, "--into", results)
    assert done.returncode == 0, done.stderr
    assert "3 record(s) of mnist_mlp, peaks_mlp (1 on cpu, 2 on gpu): 6 file(s) written" in done.stdout, done.stdout
    assert "left out: results-device-cpu-references" in done.stdout  # another folder: said, not taken
    found = load_records(results)
    assert sorted((r.spec.name, r.framework, r.device.kind) for r in found.values()) == [
        ("mnist_mlp", "torch", "cpu"),
        ("peaks_mlp", "jax", "gpu"),
        ("peaks_mlp", "torch", "gpu"),
    ]
    for rel in found:  # the same bytes as the lease wrote
        assert (results / rel).read_bytes() == (tmp_path / "results-device" / rel).read_bytes()
    again = ingest(archive, "--into", results)
    assert again.returncode == 0 and "0 file(s) written" in again.stdout and "6 already there" in again.stdout, again.stdout


def member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


def test_links_absolute_paths_and_climbs_are_left_out_and_nothing_lands_outside(tmp_path):
    """Members a hostile or broken archive could hold: none is written anywhere; each is said."""
    evil = [
        (member("results-device/peaks_mlp/20261126T000000Z_torch_gpu_full_aaaaaaaaaaaa.json", tarfile.SYMTYPE, link="/etc/passwd"), None),
        (member("/tmp/evil.json", size=2), b"{}"),
        (member("results-device/../../evil.json", size=2), b"{}"),
        (member("results-device/peaks_mlp/notes.txt", size=2), b"hi"),
        (member("results-device/peaks_mlp/\x1b[2Jevil.json", size=2), b"{}"),
    ]
    results = tmp_path / "results"
    done = ingest(archive_of(tmp_path, evil), "--into", results)
    assert done.returncode == 0, done.stderr
    for info, _ in evil[:-1]:
        assert f"left out: {info.name}" in done.stdout, done.stdout
    assert "left out: 'results-device/peaks_mlp/\\x1b[2Jevil.json'" in done.stdout and "\x1b" not in done.stdout, done.stdout
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*evil*")) + [p.name for p in results.rglob("*.txt")]
    assert written == [] and not any(p.is_symlink() for p in results.rglob("*"))


@pytest.mark.parametrize(
    "harm, said",
    [
        ("record", "not a harness record"),
        ("artifact", "sha256 differs from the record's"),
        ("there", "already there with other bytes"),
    ],
)
def test_a_bad_record_or_a_clash_writes_nothing_and_says_which_in_one_line(tmp_path, harm, said):
    device = records(tmp_path) / "peaks_mlp"
    results = tmp_path / "results"
    victim = sorted(device.glob("*_jax_gpu_*.json"))[0]
    if harm == "record":
        victim.write_text(victim.read_text().replace('"status"', '"statu"', 1))
    elif harm == "artifact":
        artifact = victim.with_suffix(".npz")
        artifact.write_bytes(artifact.read_bytes() + b"\0")
    else:
        (results / "peaks_mlp").mkdir(parents=True)
        (results / "peaks_mlp" / victim.name).write_text("{}")
    archive = pack(tmp_path)
    done = ingest(archive, "--into", results)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith("tools/device_records.py: "), done.stderr
    assert victim.name in lines[0]
    kept = [p for p in results.rglob("*") if p.is_file()] if results.exists() else []
    assert kept == ([results / "peaks_mlp" / victim.name] if harm == "there" else [])  # nothing written


def test_an_archive_that_is_not_one_is_one_line_and_exit_2(tmp_path):
    bogus = tmp_path / "records.tar.gz"
    bogus.write_bytes(b"not a tarball")
    done = ingest(bogus, "--into", tmp_path / "results")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a readable .tar.gz" in done.stderr, done.stderr
    assert not (tmp_path / "results").exists()
