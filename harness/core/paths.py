"""Where the project's own files are: the checkout, its specs, the committed reference
records, a user's runs, and the catalogue of known library differences."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SPECS_DIR = PROJECT_ROOT / "specs"
# Where a user's runs go by default (git-ignored), and where the committed reference
# records live, from which the report is built; both relative to the working folder.
RUNS_DIR = Path("runs")
REFERENCE_DIR = Path("results")
KNOWN_DIFFERENCES_FILE = PROJECT_ROOT / "harness" / "known_differences.yaml"
LIBRARY_DEFECTS_FILE = PROJECT_ROOT / "harness" / "library_defects.yaml"
