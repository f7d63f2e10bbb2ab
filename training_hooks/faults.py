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
        self._warned = False  # the run's one warning was given

    def report(self, what: str, error: BaseException, warn: bool = True) -> str:
        """Record that ``what`` failed (e.g. "could not write traces") because of ``error``;
        returns the summary's line for that cause. The cause is ``what`` and the error's kind (its
        errno if it has one: a file name in the message does not make another cause). ``warn``
        False: a line for the summary only, never the run's warning (a cause another report warns
        of better)."""
        errno = getattr(error, "errno", None)
        cause = (what, type(error).__name__, errno if errno is not None else str(error))
        line = self._line_of.get(cause)
        if line is not None:
            self._times[line] += 1
            return line
        line = f"{what}: {type(error).__name__}: {error}"
        if warn and not self._warned:
            self._warned = True
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

    def withdraw(self, line: str) -> None:
        """Take a cause's line out of the summary (an outage that another line now tells the end
        of); the same cause later is a new line."""
        if line in self._times:
            self.lines.remove(line)
            del self._times[line]
            self._line_of = {cause: kept for cause, kept in self._line_of.items() if kept != line}
