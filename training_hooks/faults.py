"""What the profiler could not do. Training never stops for it: the first fault is one warning,
every fault is listed in the summary printed on close."""

from __future__ import annotations

import warnings


class Faults:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.lines: list[str] = []

    def report(self, what: str, error: BaseException) -> None:
        """Record that ``what`` failed (e.g. "could not write a trace") because of ``error``."""
        line = f"{what}: {type(error).__name__}: {error}"
        if not self.lines:
            warnings.warn(f"phaseprof ({self.run_dir}): {line}. Training goes on; further problems are "
                          "listed in the summary printed by close().", RuntimeWarning, stacklevel=2)
        self.lines.append(line)
