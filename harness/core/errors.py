"""The harness's own error types: every bad input ends in one of these, with a message
that names the file and the key, and the CLI turns them into exit code 2."""


class HarnessError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class SpecError(HarnessError, ValueError):
    """A spec (a file, or the Python API's arguments) that does not parse or does not validate."""


class DataError(HarnessError):
    """A data file that is missing, truncated, malformed or fails its checksum."""


class RecordError(HarnessError):
    """A results record that does not validate, or cannot be written."""


class Unsupported(ValueError):
    """A run an adapter cannot express in the mode asked for (a fast mode that trains dense
    networks only, say): a documented limit of that mode, so the run is skipped with this
    reason, not failed."""
