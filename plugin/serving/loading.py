"""Worker processes that read and analyse trace files for TensorBoard, one file at a time each.

Decoding a large trace needs several times its size in memory for a moment and seconds of CPU, so
it happens outside TensorBoard's process. Files come from a logdir others write, so any of them
may take too long or kill the process reading it: each worker runs one file at a time, watched by
one thread here. A worker that dies is replaced and only its own file is reported; a file that
passes its time limit has its worker killed; nothing a file does holds up the others or
TensorBoard's exit. Workers die with TensorBoard: they are killed on close and at exit, and a
worker whose parent is gone (killed without a chance to clean up) exits by itself.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from multiprocessing import connection

from ..reading.discovery import TraceFile
from ..reading.file_bytes import Limits, TraceError

logger = logging.getLogger(__name__)

#: A worker stopped after this long on one file (the reader's own budget, plus a margin).
_GRACE_S = 30.0
#: How long a file handed to a worker may wait for it to begin (a process starting: an interpreter
#: importing numpy and the plugin, minutes on a machine busy enough) before it counts as hung.
_START_S = 300.0


#: A trace of fewer events (host and device) is decoded again in well under half a second (~0.1 s
#: per 70,000 events on one core): loaded while other files wait, its step index is left out, and
#: written when one of its steps is first opened (`store.cut_step`). Writing it costs about a tenth of
#: the load, which a logdir of many ranks pays before its first answer.
SMALL_TRACE_EVENTS = 100_000


def load(item: tuple[TraceFile, bool], beside: bool = True):
    """What a worker does with one file (a module-level function: the worker imports it): ``item`` is
    the file and whether other files wait for a loader (`LoaderPool` with ``backlog=True``);
    ``beside=False`` for a read-only TensorBoard (`spans.analyze_file`)."""
    from ..spans import analyze_file

    f, others_waiting = item
    index_from = SMALL_TRACE_EVENTS if others_waiting else 0
    return analyze_file(f, index_from_events=index_from, beside=beside)


class _Worker:
    def __init__(self, ctx, target: Callable):
        parent_end, child_end = ctx.Pipe()
        self.conn = parent_end
        self.process = ctx.Process(target=_worker_main, args=(child_end, target, os.getpid()), daemon=True,
                                   name="phaseprof-loader")
        with _main_hidden() if getattr(target, "__module__", None) != "__main__" else contextlib.nullcontext():
            self.process.start()
        child_end.close()
        self.task = None  # (key, TraceFile) being loaded
        self.deadline = 0.0  # monotonic time past which the load is stopped

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(1)
        except (OSError, ValueError, AssertionError):
            pass
        self.conn.close()


@contextlib.contextmanager
def _main_hidden():
    """A spawned process first imports its parent's main module again (so that what is defined there
    unpickles); TensorBoard's is ``tensorboard.main``, about half a second of CPU per worker for
    imports it never uses. Hidden while a worker whose work is defined elsewhere starts: the child is
    told of no main module."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _worker_main(conn, target: Callable, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: TensorBoard decides
    _die_with(parent)
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        try:
            conn.send(("begin",))  # the file's clock starts now, not while this process was starting
        except (OSError, ValueError):
            return
        try:
            result = ("ready", target(item))
        except TraceError as e:
            result = ("error", e.reason)
        except MemoryError:
            result = ("error", "not enough memory to load this file")
        except Exception as e:  # noqa: BLE001 - reported as this file's error; the worker goes on
            logging.getLogger(__name__).exception("phaseprof: analysing %s failed", getattr(item, "path", item))
            result = ("error", f"internal error while analysing: {type(e).__name__}: {e}")
        try:
            conn.send(result)
        except (OSError, ValueError):
            return


def _die_with(parent: int) -> None:
    """Exit when the parent process is gone, even if it was killed outright.

    On Linux the kernel does it; elsewhere a thread watches the parent. Only where it must: a
    process with a second thread does not fork, and the reader forks to decode a large file on
    two cores (`reading.split`)."""
    try:  # Linux: the kernel sends SIGKILL when the thread that started this process ends
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # gone before the signal was asked for
                os._exit(0)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="phaseprof-parent-watch", daemon=True).start()


class LoaderPool:
    """Up to ``processes`` workers loading queued files; ``done(key, state, result)`` is called from
    the pool's thread with state ``"ready"`` (result: the analysis) or ``"error"`` (result: why).
    ``backlog``: the target is given ``(file, whether other files still wait)``, else the file."""

    def __init__(self, done: Callable, processes: int, *, target: Callable, timeout_s: float | None = None,
                 backlog: bool = False):
        self._done = done
        self._processes = processes
        self._target = target
        self._backlog = backlog
        self._timeout_s = timeout_s if timeout_s is not None else Limits.from_env().max_seconds + _GRACE_S
        self._ctx = multiprocessing.get_context("spawn")
        self._queue: collections.deque = collections.deque()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._thread: threading.Thread | None = None
        _live.add(self)

    def submit(self, key, f: TraceFile) -> None:
        with self._lock:
            if self._closed:
                return
            self._queue.append((key, f))
            if self._thread is None:
                # The workers' parent-death signal is tied to the thread that starts them: this one,
                # which lives as long as the pool.
                self._thread = threading.Thread(target=self._run, name="phaseprof-loading", daemon=True)
                self._thread.start()
            self._wake()

    def close(self) -> None:
        """Stop every worker now (a file being loaded is abandoned)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = self._workers, []
            self._queue.clear()
        for w in workers:
            w.kill()
        self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(0.5)
            if thread.is_alive():
                return  # still receiving a result: its pipe stays open, the process is ending anyway
        with self._lock:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._closed:
            try:
                self._step()
            except Exception:  # noqa: BLE001 - the pool must go on with the other files
                if not self._closed:
                    logger.exception("phaseprof: the loading thread failed; going on")
                    time.sleep(0.1)

    def _step(self) -> None:
        """Hand out work, wait for a result, a death, a deadline or new work, and act on it."""
        self._dispatch()
        with self._lock:
            busy = [w for w in self._workers if w.task is not None]
            waiting = [w.conn for w in busy] + [w.process.sentinel for w in busy]
        timeout = 1.0
        if busy:
            timeout = max(0.05, min(timeout, min(w.deadline for w in busy) - time.monotonic()))
        ready = connection.wait([*waiting, self._wake_r], timeout)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        self._collect(busy)

    def _dispatch(self) -> None:
        """Give queued files to idle workers, starting workers up to the limit; stop idle workers
        when nothing is left to do (their memory goes back to the system)."""
        with self._lock:
            if self._closed:
                return
            idle = [w for w in self._workers if w.task is None]
            while self._queue and (idle or len(self._workers) < self._processes):
                if idle:
                    worker = idle.pop()
                else:
                    try:
                        worker = _Worker(self._ctx, self._target)
                    except OSError as e:
                        key, _ = self._queue.popleft()
                        self._report(key, "error", f"could not start a loading process ({e})")
                        continue
                    self._workers.append(worker)
                key, f = self._queue.popleft()
                try:
                    worker.conn.send((f, bool(self._queue)) if self._backlog else f)
                except (OSError, ValueError):
                    self._workers.remove(worker)
                    worker.kill()
                    self._queue.appendleft((key, f))
                    continue
                # the file's own time starts when the worker begins it (``begin``), not while it starts
                worker.task, worker.deadline = (key, f), time.monotonic() + _START_S + self._timeout_s
            if not self._queue and all(w.task is None for w in self._workers):
                for w in self._workers:
                    with contextlib.suppress(OSError, ValueError):
                        w.conn.send(None)
                    w.process.join(0)  # reaped later by multiprocessing if still exiting
                    w.conn.close()
                self._workers = []

    def _collect(self, busy: list[_Worker]) -> None:
        now = time.monotonic()
        for w in busy:
            key, f = w.task
            outcome = None
            try:
                while w.conn.poll():
                    outcome = w.conn.recv()
                    if outcome != ("begin",):
                        break
                    w.deadline, outcome = time.monotonic() + self._timeout_s, None
            except (EOFError, OSError):
                outcome = None
            except Exception as e:  # noqa: BLE001 - a result that does not unpickle
                outcome = ("error", f"internal error while loading: {type(e).__name__}: {e}")
            if outcome is not None:
                w.task = None
                self._report(key, *outcome)
                continue
            if not w.process.is_alive():
                code = w.process.exitcode
                how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
                reason = f"the process loading this file {how} (out of memory?); it was replaced"
            elif now > w.deadline:
                reason = f"loading took longer than {self._timeout_s:.0f} s and was stopped"
            else:
                continue
            with self._lock:
                if w in self._workers:
                    self._workers.remove(w)
            w.kill()
            self._report(key, "error", reason)

    def _report(self, key, state: str, result) -> None:
        try:
            self._done(key, state, result)
        except Exception:  # noqa: BLE001
            logger.exception("phaseprof: recording a loaded file failed")


_live: weakref.WeakSet[LoaderPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_live):
        pool.close()
