"""No process a test starts outlives it (the autouse fixture in `tests.conftest`).

The test process is made a child subreaper (Linux), so a process whose parent dies (a torchrun
agent killed, leaving its ranks; a training script whose background analyses still run) is
re-parented to it rather than to init, and stays in view: every process a test leaves behind is a
descendant of this one. After each test, its new descendants get `LEFTOVER_S` to exit on their own
(the background ``phaseprof cache --background`` processes of a loop finish by themselves; while
waited for they are lifted out of idle priority, which beside CPU hogs would starve them); any still
running then are killed, and the test fails naming them. Processes meant to outlive a test, started
by session-scoped fixtures (the S3 server of `tests.s3`), are exempted by name with
`outlives_tests`; multiprocessing's own helper processes (its resource tracker, its forkserver) are
exempt too, and so is what a process older than the test starts (a module's Chromium opening
renderers for a page): that is the older process's own business, and its fixture's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

#: Seconds a test's leftover processes have to exit on their own.
LEFTOVER_S = float(os.environ.get("PHASEPROF_TEST_LEFTOVER_S", "120"))

_PR_SET_CHILD_SUBREAPER = 36
_exempt: set[int] = set()


def become_subreaper() -> None:
    """Orphans of this process's descendants are re-parented here (Linux only)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def outlives_tests(pid: int) -> None:
    """Exempt ``pid`` (and its descendants) from the check: a session fixture's process."""
    _exempt.add(pid)


def no_longer_exempt(pid: int) -> None:
    _exempt.discard(pid)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0].decode()


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _helpers() -> set[int]:
    """multiprocessing's resource tracker and forkserver of this process: started once, kept."""
    found = set()
    for module, attr, pid in (
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
    ):
        helper = getattr(sys.modules.get(module), attr, None)
        if getattr(helper, pid, None):
            found.add(getattr(helper, pid))
    return found


Stat = tuple[int, int, str]


def _children_of(pid: int) -> list[int] | None:
    """``pid``'s children from its threads' ``children`` files (a few small reads, where reading
    every process's stat is hundreds on a shared machine; the check runs twice a test); None where
    the kernel has no such files."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    found = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as fh:
                found += [int(child) for child in fh.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{thread}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return found


def _descendants(root: int, leave_out: Callable[[int, int], bool]) -> dict[int, Stat]:
    """Every descendant of ``root`` (pid: its stat), but those ``leave_out(pid, start time)`` names
    and what is under them."""
    if _children_of(os.getpid()) is None:  # no children files: from every process's parent
        return _descendants_from_parents(root, leave_out)
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid in _children_of(parent) or ():
            stat = _stat(pid)
            if stat is not None and stat[0] == parent and not leave_out(pid, stat[1]):
                todo.append(pid)
                found[pid] = stat
    return found


def _descendants_from_parents(root: int, leave_out: Callable[[int, int], bool]) -> dict[int, Stat]:
    children: dict[int, list[int]] = {}
    facts = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            facts[int(entry)] = stat
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if not leave_out(pid, facts[pid][1]):
                todo.append(pid)
                found[pid] = facts[pid]
    return found


def running_descendants(before: Iterable[tuple[int, int]] = ()) -> set[tuple[int, int]]:
    """(pid, start time) of every living (not zombie) descendant of this process, but the exempt;
    with ``before``, only those started since, and not under one of ``before``: the processes a
    running browser or server of a fixture starts for its own ends are its business."""
    if not os.path.isdir("/proc"):
        return set()
    skip, old = _exempt | _helpers(), set(before)
    found = _descendants(os.getpid(), lambda pid, start: pid in skip or (pid, start) in old)
    return {(pid, start) for pid, (_, start, state) in found.items() if state != "Z"}


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it, those in sessions of their own too (torchrun
    starts each rank in one): found before any is killed, since an orphan leaves the tree."""
    for each in [pid, *_descendants(pid, lambda pid, start: False)]:
        with contextlib.suppress(OSError):
            os.kill(each, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """The living children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if (
            entry.isdigit()
            and (stat := _stat(int(entry))) is not None
            and stat[0] == pid
            and stat[2] != "Z"
        ):
            found.append(int(entry))
    return found


def _alive(process: tuple[int, int]) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[1] == process[1] and stat[2] != "Z"


def _lift(pid: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # gone, not ours to lift, or not Linux
        if os.sched_getscheduler(pid) == os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))


def left_behind(before: Iterable[tuple[int, int]], wait_s: float = LEFTOVER_S) -> list[str]:
    """Descendants started since ``before`` that are still running after ``wait_s`` seconds (each
    lifted out of idle priority meanwhile), killed, as "pid command" lines; [] if none."""
    deadline = time.monotonic() + wait_s
    while True:
        new = running_descendants(before)
        if not new:
            return []
        if time.monotonic() >= deadline:
            break
        for pid, _ in new:
            _lift(pid)
        time.sleep(0.2)
    named = [f"{pid} {_command(pid)}" for pid, _ in sorted(new)]
    for process in new:
        if _alive(process):
            with contextlib.suppress(OSError):
                os.kill(process[0], signal.SIGKILL)
    return named
