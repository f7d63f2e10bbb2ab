"""Shared by the benchmark scripts: wall time and peak RSS of a command, its children included."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def _tree_rss_kb(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc), in KiB."""
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            with open(f"/proc/{p}/task/{p}/children") as fh:
                stack += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run(cmd: list[str], **kwargs) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd``; return (seconds, peak RSS of its process tree in MiB, result)."""
    peak = 0
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    return elapsed, peak / 1024, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def env_without_user_site() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env
