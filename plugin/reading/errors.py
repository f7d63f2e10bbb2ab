"""The error of a trace file that cannot be read (its own module: readers of cached analyses need
it without loading the decoder)."""

from __future__ import annotations


class TraceError(Exception):
    """A trace file that cannot be read; ``str()`` is one line naming the file and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):  # survives the trip back from a worker process
        return (TraceError, (self.path, self.reason))
