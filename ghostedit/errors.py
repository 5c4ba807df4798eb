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


def error_summary(error: BaseException) -> str:
    """The informative start of an error's message, in one line. Some messages open with a heading only
    ("backend='inductor' raised:"), with the cause on the next line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:300]
