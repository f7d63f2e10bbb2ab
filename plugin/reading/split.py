"""Decoding a large trace in two processes: split the file at an event boundary near the middle
of the work, decode one half here and the other in a forked child, and hand back both parts.

Decoding is CPU-bound C code that holds the interpreter, so a second process is the only way to
use a second core on one file. Anything unusual makes the split give up (return None) and the
caller decode the file in one process: the split is an optimisation, never a second reader.
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import threading
from collections.abc import Callable

#: Files larger than this are decoded by two processes (where fork is safe).
PARALLEL_MIN_BYTES = 24 << 20

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")

#: The share of the events this process decodes; the child takes the rest. Less than half: this
#: process also frees its events, then unpickles and merges the child's columns (~8% of a half's
#: work), which the child, exiting at once, does not.
FIRST_SHARE = 0.46


def fork_is_safe() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1


#: Children of earlier splits that sent their half and may not have exited yet.
_exited: list[int] = []


def _reap(block: bool = False) -> None:
    for pid in list(_exited):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _exited.remove(pid)


atexit.register(_reap, True)


def _halfway(buf, start: int, samples: int = 32, window: int = 1 << 15) -> int:
    """The offset that splits the decoding work in two, `FIRST_SHARE` before it.

    The work grows with the number of events more than with bytes, and events are not the same
    size along a file (memory events, at the end of today's traces, are half the size of ops), so
    events are counted in a few small windows spread over the file and the split put where that
    share of the estimated events lies before it."""
    size = len(buf) - start
    step = size // samples
    if step < window:
        return start + int(size * FIRST_SHARE)
    counts = [bytes(buf[start + i * step : start + i * step + window]).count(b'"ph"') + 1 for i in range(samples)]
    share, seen = sum(counts) * FIRST_SHARE, 0.0
    for i, c in enumerate(counts):
        if seen + c >= share:
            return start + int((i + (share - seen) / c) * step)
        seen += c
    return start + int(size * FIRST_SHARE)


def decode_in_two(buf, start: int, decode: Callable) -> list | None:
    """``[decode(first half), decode(second half)]``, the second decoded in a forked child; None
    to fall back to one process. The child calls ``decode(half, kept)`` with a list where what it
    decoded may be left unfreed (it exits at once with ``os._exit``).

    The split is at a ``},{`` between two events near `FIRST_SHARE` of the work (`_halfway`). Each
    process rewrites a few bytes of its own copy-on-write copy so its half is a whole JSON document
    again: the first half ends ``}]}``, the second starts ``{"traceEvents":[{``. A split that did not
    land between two events fails to decode (or decodes to something odd, which is checked by the
    caller's decoder raising), and the caller decodes the file in one process.
    """
    _reap()
    middle = _halfway(buf, start)
    m = _BOUNDARY.search(buf, middle, min(len(buf), middle + (1 << 20)))
    if m is None:
        return None
    comma = buf.find(b",", m.start())
    brace = m.end() - 1
    bare_list = buf[start : start + 1] == b"["
    head_close = b"]" if bare_list else b"]}"
    tail_open = b"[" if bare_list else b'{"traceEvents":['
    if comma < start + len(tail_open) + 1:
        return None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the second half
        status = 0
        try:
            os.close(read_fd)
            buf[brace - len(tail_open) : brace] = tail_open
            kept: list = []  # the decoded events: left for the exit below, never freed one by one
            part = decode(memoryview(buf)[brace - len(tail_open) :], kept)
            payload = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001 - the parent falls back to one process
            payload = b""
            status = 1
        try:
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        finally:
            os._exit(status)
    os.close(write_fd)
    saved = bytes(buf[comma : brace + 1])
    try:
        buf[comma : brace + 1] = head_close.ljust(brace + 1 - comma, b" ")
        first = decode(memoryview(buf)[: brace + 1])
        failed = False
    except Exception:  # noqa: BLE001 - any failure: the caller decodes in one process
        failed = True
    finally:
        buf[comma : brace + 1] = saved
    with os.fdopen(read_fd, "rb") as inp:
        payload = inp.read()
    if failed or not payload:
        os.waitpid(pid, 0)
        return None
    second = pickle.loads(payload)
    _exited.append(pid)  # tearing down its memory takes the child a while: reaped later
    return [first, second]
