"""The harness's own error types: every bad input ends in one of these, with a message
that names the file and the key, and the CLI turns them into exit code 2."""

import traceback


class HarnessError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class SpecError(HarnessError, ValueError):
    """A spec (a file, or the Python API's arguments) that does not parse or does not validate;
    or a port's code that fails on it (harness/inputs/port.py's PortError, one of these)."""


class DataError(HarnessError):
    """A data file that is missing, truncated, malformed or fails its checksum."""


class RecordError(HarnessError):
    """A results record that does not validate, or cannot be written."""


class Unsupported(ValueError):
    """A run an adapter cannot express in the mode asked for (a fast mode that trains dense
    networks only, say): a documented limit of that mode, so the run is skipped with this
    reason, not failed."""


# JAX's note on every exception that passes one of its API boundaries (its traceback
# filtering: a separator line, then "For simplicity, JAX has removed its internal frames"):
# boilerplate about a traceback the user never sees.
_JAX_NOTE = "For simplicity, JAX has removed its internal frames"


def described(exc: BaseException) -> str:
    """`Type: message` as the traceback module writes it, its notes too but JAX's (issue 55:
    the boilerplate reached the user on every failed JAX run)."""
    text = "".join(traceback.format_exception_only(type(exc), exc))
    for note in getattr(exc, "__notes__", None) or ():
        if _JAX_NOTE in note:
            text = text.replace(note, "")
    return text.strip()
