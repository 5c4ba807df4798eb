"""Errors whose message is written for the person editing: the app shows them as they are.

Anything else that escapes the engine is a bug, reported as one. A cancelled run (telemetry.RunCancelled) is
neither: the person asked for it.
"""


class GhostEditError(Exception):
    """Base of every error meant for the end user; the message says what went wrong and what to do."""


class InvalidRequestError(GhostEditError, ValueError):
    """An edit request with a parameter out of range or missing."""


class InputImageError(GhostEditError, ValueError):
    """An input image that cannot be used: not an image, corrupt, too large, too small or too elongated."""


class GpuOutOfMemoryError(GhostEditError, RuntimeError):
    """The edit did not fit in GPU memory even after freeing every cached pipeline and retrying."""
