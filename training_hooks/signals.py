"""Closing the profiler on SIGTERM, then letting the process handle the signal as it would have.

A job scheduler (Slurm, Kubernetes, torchrun's elastic agent) ends a run with SIGTERM, usually
some seconds before SIGKILL. Closing on it writes the trace of an active window (torch.profiler
keeps it in memory until the window ends), the last steps' scalars and the summary. The handler
then restores the handler that was installed before and passes the signal on: to a Python handler
by calling it (Lightning's, say), to the default action by raising the signal again, so the
process ends as it would have. Installed only from the main thread (Python's rule) and only where
SIGTERM is not ignored. A child forked after it was installed (a ``fork`` multiprocessing Pool,
whose ``terminate()`` sends its workers SIGTERM) inherits the handler but not the run: there the
handler closes nothing and only passes the signal on, so the child ends as it would have. Nothing
can run on SIGKILL: see docs/training-hooks.md for what it loses.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable


class CloseOnSigterm:
    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close
        self._pid = os.getpid()  # the process whose run it closes
        self._previous: object = None
        self._installed = False
        if not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or previous is None:  # ignored, or set outside Python: leave it
            return
        self._previous = previous
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def restore(self) -> None:
        """Put the previous handler back, unless another was installed on top of ours since."""
        if not self._installed:
            return
        self._installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, self._previous)
        except ValueError:  # not on the main thread (a close from another thread): leave ours, now inert
            pass

    def _handle(self, signum: int, frame: object) -> None:
        previous = self._previous
        try:
            if os.getpid() == self._pid:  # in a forked child the run is the parent's: pass it on
                self.restore()
                self._close()
        finally:
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
