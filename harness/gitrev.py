"""Git revisions taken from the user or from a record, checked before git sees them.

A revision that starts with '-' is an option to git (`--output=FILE` writes a file), so
every revision is checked here, and every git call passes `--end-of-options` before it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harness.errors import HarnessError

FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def checked_revision(rev: str, what: str, root: Path = PROJECT_ROOT) -> str:
    """`rev` as a commit git can be given: a full 40-hex sha as it is, or the sha of a
    ref that `git rev-parse --verify` resolves to a commit. A HarnessError naming `what`
    (the option or the record key it came from) otherwise."""
    if FULL_SHA.fullmatch(rev):
        return rev.lower()
    if not rev or rev.startswith("-") or not rev.isprintable():
        raise HarnessError(f"{what}: {rev!r} is not a git revision")
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"{what}: cannot ask git about {rev!r}: {exc}") from None
    sha = done.stdout.strip()
    if done.returncode != 0 or not FULL_SHA.fullmatch(sha):
        raise HarnessError(f"{what}: {rev!r} is not a commit of this repository")
    return sha
