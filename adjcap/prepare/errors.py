"""The one error type of `adjcap prepare`: its message is a single line naming what failed and what to do."""

from __future__ import annotations


class PrepareError(RuntimeError):
    """A step could not be completed; the message names the file or URL and what to do."""


class NetworkError(PrepareError):
    """A URL could not be fetched (after the retries)."""


class ChecksumError(PrepareError):
    """A downloaded or copied file is not the published (or locked) bytes."""


class UnsafeArchiveError(PrepareError):
    """An archive holds an entry that would escape the target or is not a plain file/dir."""


class DiskFullError(PrepareError):
    """No space left while writing."""
