"""Hostile input: files in the work folder, git revisions, output paths, resource bombs.
Each case ends in exit 2 with one line (or, for the work folder, in the run going again),
and nothing is executed or written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import cli
from harness.spec import SPECS_DIR


def harness(capsys, *args: str) -> tuple[int, str, str]:
    """Run the command line in this process: its exit code, stdout and stderr."""
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def tiny_moons(folder: Path, **changes) -> Path:
    """The moons spec shrunk to 64 points, 8 hidden units and 3 steps (a run takes ms)."""
    doc = yaml.safe_load((SPECS_DIR / "moons_net.yaml").read_text())
    doc["data"]["n_samples"] = 64
    doc["model"]["layers"][0]["width"] = 8
    doc["training"]["epochs"] = 3
    doc["checks"]["probe_size"] = 16
    doc["checks"]["params_after_steps"]["step"] = 2
    doc["logging"] = {"loss_every": 1, "print_every": 1}
    doc["profiles"], doc["known_differences"] = {}, []
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        section = doc
        for key in parents:
            section = section[key]
        section[last] = value
    path = folder / "tiny_moons.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# --- 3. export replaces only regular files ----------------------------------------------


def test_export_refuses_a_fifo_a_device_or_a_link_and_writes_nothing(tmp_path, capsys):
    spec = tiny_moons(tmp_path)
    fifo, link = tmp_path / "out.npz", tmp_path / "link.npz"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere.npz")
    before = sorted(tmp_path.iterdir())
    for out in (fifo, Path("/dev/full"), link):
        code, _, err = harness(capsys, "export", spec, "--out", out)
        assert code == 2
        one_line_error(err, str(out), "not a regular file")
    assert sorted(tmp_path.iterdir()) == before and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not (tmp_path / "elsewhere.npz").exists()


def test_export_replaces_a_regular_file_through_a_temporary_one(tmp_path, capsys):
    spec, out = tiny_moons(tmp_path), tmp_path / "out.npz"
    out.write_bytes(b"old")
    assert harness(capsys, "export", spec, "--out", out)[0] == 0
    with np.load(out, allow_pickle=False) as npz:
        assert len(npz["oracle_losses"]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "tiny_moons.yaml"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
