"""Git, the one place it is called: the checkout's commit, a file or a folder at a commit,
and revisions taken from the user or from a record, checked before git sees them.

A revision that starts with '-' is an option to git (`--output=FILE` writes a file), so
every revision is checked here, and every git call passes `--end-of-options` before it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.paths import PROJECT_ROOT

FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")


def git(*args: str, root: Path = PROJECT_ROOT, timeout: float = 30) -> bytes | None:
    """git's standard output, or None where git is missing, fails or times out."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def head(root: Path = PROJECT_ROOT) -> tuple[str | None, bool | None]:
    """The checkout's commit, and whether tracked files differ from it (None: unknown)."""
    commit = git("rev-parse", "HEAD", root=root, timeout=10)
    if commit is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no", root=root, timeout=10)
    return commit.decode().strip(), None if status is None else bool(status.strip())


def checked_revision(rev: str, what: str, root: Path = PROJECT_ROOT) -> str:
    """`rev` as a commit git can be given: a full 40-hex sha as it is, or the sha of a
    ref that `git rev-parse --verify` resolves to a commit. A HarnessError naming `what`
    (the option or the record key it came from) otherwise."""
    if FULL_SHA.fullmatch(rev):
        return rev.lower()
    if not rev or rev.startswith("-") or not rev.isprintable():
        raise HarnessError(f"{what}: {rev!r} is not a git revision")
    out = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", root=root)
    sha = (out or b"").decode(errors="replace").strip()
    if not FULL_SHA.fullmatch(sha):
        raise HarnessError(f"{what}: {rev!r} is not a commit of this repository")
    return sha


def file_at(commit: str, repo_path: str, root: Path = PROJECT_ROOT) -> bytes | None:
    """A file's bytes at a checked commit, or None where git has no such file."""
    return git("show", "--end-of-options", f"{commit}:{repo_path}", root=root)


def folder_at(commit: str, folder: str, root: Path = PROJECT_ROOT) -> bytes | None:
    """A folder at a checked commit, as a tar archive, or None where git cannot make it."""
    return git("archive", "--format=tar", "--end-of-options", commit, folder, root=root, timeout=120)
