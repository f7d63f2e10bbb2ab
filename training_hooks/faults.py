"""What the profiler could not do. Training never stops for it: the first fault is one warning,
every cause is listed once in the summary printed on close, with how often it happened (a full disk
fails every write, every tick of every thread: one line each, not one per failure)."""

from __future__ import annotations

import warnings


class Faults:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.lines: list[str] = []  # one per cause, in the words of its first failure
        self._line_of: dict[tuple[str, str, object], str] = {}
        self._times: dict[str, int] = {}

    def report(self, what: str, error: BaseException) -> str:
        """Record that ``what`` failed (e.g. "could not write traces") because of ``error``;
        returns the summary's line for that cause. The cause is ``what`` and the error's kind (its
        errno if it has one: a file name in the message does not make another cause)."""
        errno = getattr(error, "errno", None)
        cause = (what, type(error).__name__, errno if errno is not None else str(error))
        line = self._line_of.get(cause)
        if line is not None:
            self._times[line] += 1
            return line
        line = f"{what}: {type(error).__name__}: {error}"
        if not self.lines:
            warnings.warn(f"phaseprof ({self.run_dir}): {line}. Training goes on; further problems are "
                          "listed in the summary printed by close().", RuntimeWarning, stacklevel=2)
        self._line_of[cause] = line
        self._times[line] = self._times.get(line, 0) + 1
        self.lines.append(line)
        return line

    def summary(self) -> list[str]:
        """The summary's lines: each cause once, with its count when it happened more than once."""
        return [line if self._times.get(line, 1) == 1 else f"{line} ({self._times[line]} times)"
                for line in self.lines]
