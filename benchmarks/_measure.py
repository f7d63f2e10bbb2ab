"""Shared by the benchmark scripts: wall time of a command, and peak memory of its process tree.

Time and memory are measured in separate runs: sampling memory costs CPU that a 2-core machine
would take from the command. Memory is the proportional set size (PSS) summed over the process and
its children: pages that a forked child shares with its parent (or that both map from one file)
count once, where adding RSS would count them twice.

Commands run with ``PYTHONDONTWRITEBYTECODE`` unset, so that Python reuses compiled bytecode as it
does on a user's machine, rather than compiling the project's modules on every start.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time


def _tree(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc)."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                stack += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def tree_kib(pid: int, field: str = "Pss:") -> int:
    """``field`` of /proc/<pid>/smaps_rollup (``Pss:`` or ``Rss:``) summed over the process tree, in KiB."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith(field))
        except (FileNotFoundError, ProcessLookupError, PermissionError, StopIteration):
            continue
    return total


def _env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str], cwd: str | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd``; (seconds, result)."""
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, env=_env(), cwd=cwd)
    return time.perf_counter() - start, result


def peak_mib(cmd: list[str], cwd: str | None = None, every: float = 0.01) -> float:
    """Run ``cmd``; the peak PSS of its process tree in MiB."""
    peak = 0
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd=cwd)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_kib(proc.pid))
            time.sleep(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    proc.wait()
    done.set()
    sampler.join()
    return peak / 1024


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]
