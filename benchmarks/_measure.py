"""Shared by the benchmark scripts: wall time of a command, and peak memory of its process tree.

Time and memory are measured in separate runs: sampling memory costs CPU that a 2-core machine
would take from the command. Memory is the proportional set size (PSS) summed over the process and
its children: pages that a forked child shares with its parent (or that both map from one file)
count once, where adding RSS would count them twice.

Commands run with ``PYTHONDONTWRITEBYTECODE`` unset, so that Python reuses compiled bytecode as it
does on a user's machine, rather than compiling the project's modules on every start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, for tests/
from tests.tensorboard_server import TensorBoard  # noqa: E402


def _tree(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc)."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for task in tasks:  # each thread's children are its own: TensorBoard starts its workers from a thread
            try:
                with open(f"/proc/{p}/task/{task}/children") as fh:
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


class TreeCpu:
    """CPU seconds (user + system) used by a process and every descendant it has had, sampled every
    ``every`` seconds from a thread (Linux /proc): children that exit unreaped would otherwise leave
    no trace. On a shared machine, the work a command did whatever the other processes took."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self._pid, self._every = pid, every
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for p in _tree(self._pid):
            try:
                with open(f"/proc/{p}/stat") as fh:
                    fields = fh.read().rpartition(")")[2].split()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            self._seen[p] = max(self._seen.get(p, 0.0), (int(fields[11]) + int(fields[12])) / tick)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._sample()

    def seconds(self) -> float:
        self._sample()
        return sum(self._seen.values())

    def own_seconds(self) -> float:
        """The process's own part (without its descendants)."""
        self._sample()
        return self._seen.get(self._pid, 0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra or {})
    return env


def timed(cmd: list[str], cwd: str | None = None, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd`` (``env``: variables set on top of this process's); (seconds, result)."""
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, env=_env(env), cwd=cwd)
    return time.perf_counter() - start, result


def peak_mib(cmd: list[str], cwd: str | None = None, every: float = 0.01, env: dict | None = None) -> float:
    """Run ``cmd``; the peak PSS of its process tree in MiB."""
    peak = 0
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(env), cwd=cwd)
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


#: Debian's chromium, headless, as the browser tests drive it.
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def in_browser(url: str, measure, times: int) -> list[dict]:
    """``measure(browser, url)`` ``times`` times in one headless Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            return [measure(browser, url) for _ in range(times)]
        finally:
            browser.close()


def print_medians(results: list[dict], labels: list[tuple[str, str]]) -> None:
    """For each (key, label): the median of the results' values in seconds, and every value."""
    for name, label in labels:
        values = [r[name] for r in results]
        print(f"{label:34s} median {statistics.median(values):.3f} s  (runs: {', '.join(f'{v:.3f}' for v in values)})")


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


class TensorBoardServer(TensorBoard):
    """A ``tensorboard --logdir … --port 0`` process of ``python`` (`tests.tensorboard_server`), run
    from the logdir (not the checkout, whose package metadata would leak into a peer's environment);
    ``started`` is when it was launched (``perf_counter``)."""

    def __init__(self, python: str, logdir: str, extra: tuple[str, ...] = ()):
        started = time.perf_counter()
        super().__init__(logdir, *extra, python=python, cwd=logdir if os.path.isdir(logdir) else tempfile.gettempdir())
        self.started = started
        self.url = self.url.rstrip("/")

    def get(self, path: str):
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except (urllib.error.URLError, ConnectionError):
            return 0, b""

    def poll(self, path: str, ok, timeout: float = 300) -> float:
        """Seconds from process launch until ``ok(body)`` holds for ``path``."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            status, body = self.get(path)
            if status == 200 and ok(body):
                return time.perf_counter() - self.started
            time.sleep(0.05)
        raise SystemExit(f"{path} did not answer in {timeout} s\n" + "".join(self.log[-30:]))

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def timed_get(tb: TensorBoardServer, path: str) -> tuple[float, bytes]:
    """Seconds to ``GET path`` and its body; a status other than 200 ends the benchmark."""
    started = time.perf_counter()
    status, body = tb.get(path)
    elapsed = time.perf_counter() - started
    if status != 200:
        raise SystemExit(f"{path} answered {status}")
    return elapsed, body


def drawing_args(doc: str, size: str) -> argparse.Namespace:
    """A tab-drawing benchmark's arguments: how much it draws (``--<size>``, 50,000 by default) and
    how many pages it measures after the first (``--repeat``)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(f"--{size}", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    return parser.parse_args()


def draw_in_tab(browser, url: str, view: str, route: str, viewport: dict, timeout_ms: int,
                draw_measure: str, read: Callable[[Any], dict]) -> dict:
    """Open the tab at ``url`` on ``view`` (its hash parameters after ``p.phaseprof.view=``) in a fresh
    page and wait for the frontend's ``draw_measure`` performance entry. Returns the seconds of the
    draw, of the ``/route`` fetch and from opening to drawn, with what ``read(the tab's frame)``
    reads off the drawn tab before the page closes."""
    page = browser.new_page(viewport=viewport)
    started = time.perf_counter()
    page.goto(f"{url}/#phaseprof&p.phaseprof.view={view}")
    frame = None
    while frame is None:
        frame = next((f for f in page.frames if "plugin_entry.html" in f.url), None)
        page.wait_for_timeout(20)
    frame.wait_for_function(f"performance.getEntriesByName({draw_measure!r}).length > 0", timeout=timeout_ms)
    whole = time.perf_counter() - started
    draw = frame.evaluate(f"performance.getEntriesByName({draw_measure!r})[0].duration") / 1000
    fetch = frame.evaluate(f"performance.getEntriesByType('resource').filter(e => e.name.includes('/{route}?'))"
                           ".map(e => e.duration)[0]") / 1000
    shown = read(frame)
    page.close()
    return {"draw": draw, "fetch": fetch, "whole": whole, **shown}
