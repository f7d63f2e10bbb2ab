"""Background loading of trace files for TensorBoard, and the cache of their analyses.

Each file is read and analysed in a worker process (`loading.LoaderPool`: bounded, started on
demand, stopped when idle, proof against files that hang or kill their reader): TensorBoard itself
only ever holds the compact `SpanAnalysis`. Entries are keyed by path and revalidated by size and
modification time, so a span added or rewritten while TensorBoard runs is picked up on the next
scan; a file modified within the last moments may still be being written and waits for the next
scan. A span whose analysis is on disk already (`phaseprof.plugin.cache`: written by an earlier
reader, or at the source by the training job) loads from there, with no worker process; the workers
write what they analyse to that cache. A step's trace (`/trace`), the one answer that needs events,
is read from the step index written beside the analysis (`phaseprof.plugin.step_index`: the step's
range of it alone), or, without a valid index, cut out of its file again by a worker process of a
pool of its own, which writes the index meanwhile; the last answers are kept.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from .. import cache, step_index
from ..analysis.model import SpanAnalysis
from ..analysis.worker import Worker
from ..answers import Loading
from ..reading import storage
from ..reading.decode import TraceError
from ..reading.discovery import Run, TraceFile, discover, display
from ..spans import problems_of

if TYPE_CHECKING:  # `loading` (multiprocessing, sockets) is imported when a pool is started:
    from .loading import LoaderPool  # the CLI and notebooks never start one

logger = logging.getLogger(__name__)

PENDING, LOADING, READY, ERROR = "pending", "loading", "ready", "error"

T = TypeVar("T")

#: A logdir in an object store is listed again this many seconds after a scan whose listing found a
#: change (the first included), counted from the end of that scan; each listing that finds none
#: doubles the wait, up to `REMOTE_RESCAN_MAX_S`: a span uploaded shows within that (and the
#: listing's time), and a store nobody writes to is listed once a minute, not every few seconds.
REMOTE_RESCAN_S = 5.0
REMOTE_RESCAN_MAX_S = 60.0

#: Most worker processes loading trace files at once: one per core this process may use, up to this
#: many (each may need a few times its file's size in memory for a moment).
MAX_LOADERS = 8

#: Step trace documents kept (encoded), oldest dropped first; a 50,000-event step is ~10 MB.
TRACE_CACHE_BYTES = 96 << 20


def cut_step(item: tuple[TraceFile, int], beside: bool = True) -> bytes | None:
    """What a trace worker does: step ``number`` of the trace file ``f`` as Chrome-trace JSON (None if
    the file has no such step). The file is decoded again, only the step comes back, and the step
    index is written meanwhile (``beside``: as `step_index.store`), so that the file's other steps
    open without decoding it again."""
    from ..analysis.step_trace import StepCutter, document
    from ..reading.decode import read_trace

    f, number = item
    cutter = StepCutter(read_trace(f.path))
    if cache.enabled():
        step_index.store(f, cutter, beside)
    index = cutter.find(number)
    return None if index is None else msgspec.json.encode(document(cutter.tables, cutter.cut(index)))


def loaders() -> int:
    """How many files to read at once: each is read and analysed on a core of its own."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_LOADERS, cores))


class Span(msgspec.Struct):
    """One trace file and where its loading stands."""

    file: TraceFile
    state: str = PENDING
    analysis: SpanAnalysis | None = None
    error: str | None = None

    @property
    def stamp(self) -> tuple[int, int]:
        return self.file.size, self.file.mtime_ns


class TraceStore:
    """Runs, workers and spans under a logdir, with each span's analysis once loaded."""

    def __init__(self, logdir: str, *, processes: int | None = None, settle_s: float = 1.0,
                 rescan_s: float = 0.5, read_only: bool = False):
        self.logdir = logdir
        #: Read-only: analyses and step indexes go to the user's cache, never under the logdir.
        self._beside = not read_only
        self._processes = processes or loaders()
        self._settle_s = settle_s
        # a rescan of a store is a listing of its prefix: a few requests per thousand objects
        self._rescan_s = max(rescan_s, REMOTE_RESCAN_S) if storage.is_remote(logdir) else rescan_s
        #: Why the last scan could not list the logdir at all (`logdir_error`).
        self._logdir_error: str | None = None
        self._lock = threading.RLock()
        self._runs: list[Run] = []
        #: Directories the last scan could not list: (real path, why).
        self._unreadable: list[tuple[str, str]] = []
        self._spans: dict[str, Span] = {}  # by real path
        #: Counts changes of the spans (one added, removed, reloaded, loaded): what `of_run` is kept by.
        self._changes = 0
        self._scanned_at = float("-inf")
        #: Seconds from the last scan to the next (a store's grows while its listings find nothing).
        self._interval = self._rescan_s
        self._last_listing: frozenset | None = None  # what a store's last listing found
        self._pool: LoaderPool | None = None
        self._closed = False
        self._scanning = False  # a background scan is running
        #: A scan of a store is under way: its listing, then the fetching of the entries it found, which
        #: may take a while (another listing meanwhile would cost the store and find nothing new to load).
        self._scanning_store = False
        #: (run, worker, what) -> (the worker's version, a result derived from its analyses); (run, what)
        #: -> (the versions of the run's workers, a result derived from all of them)
        self._derived: dict[tuple, tuple[tuple, object]] = {}
        #: Step traces by (path, size, mtime, step), oldest first; the pool that cuts them out.
        self._traces: collections.OrderedDict[tuple, bytes | None] = collections.OrderedDict()
        self._trace_bytes = 0  # their size in all, kept as they come and go
        self._trace_pool: LoaderPool | None = None
        self._trace_waits: dict[tuple, tuple[threading.Event, list]] = {}

    # --- scanning ---------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Rescan the logdir (at most every ``rescan_s`` seconds unless forced) and queue new or
        changed files whose writing has settled. A store's logdir is rescanned in the background unless
        forced: a request answers from the last listing rather than wait seconds for the next one."""
        if not force and storage.is_remote(self.logdir):
            self.refresh_soon()
            return
        self._refresh(force)

    def _refresh(self, force: bool) -> None:
        remote = storage.is_remote(self.logdir)
        with self._lock:
            if self._closed or (not force and time.monotonic() - self._scanned_at < self._interval):
                return
            if remote and self._scanning_store:
                return  # a store is listed again once the scan under way has loaded what it found
            self._scanned_at = time.monotonic()
            self._scanning_store = remote
        try:
            self._scan(remote)
        finally:
            with self._lock:
                self._scanning_store = False
                if remote:  # the wait runs from the scan's end: a long one is not followed at once
                    self._scanned_at = time.monotonic()

    def _scan(self, remote: bool) -> None:
        """List the logdir, then load each new or changed span: from its entry, or in a worker process."""
        unreadable: list[tuple[str, str]] = []
        try:  # a store that cannot be listed raises: it is the logdir that cannot be read, not a folder
            runs = (discover(self.logdir) if remote
                    else discover(self.logdir, unreadable) if os.path.isdir(self.logdir) else [])
        except (OSError, ValueError, storage.StorageError) as e:
            why = storage.cannot_list(self.logdir, e) if remote else f"cannot scan {self.logdir}: {e}"
            if why != self._logdir_error:  # once, not at every rescan
                logger.warning("phaseprof: %s", why)
                self._logdir_error = why
            return
        self._logdir_error = None
        if remote:
            found = frozenset(
                [(f.path, f.size, f.mtime_ns, f.etag) for run in runs for f in run.files]
                + [(run.name, run.has_scalars, *run.rank_scalars) for run in runs])
            with self._lock:
                same = found == self._last_listing
                longer = min(2 * self._interval, REMOTE_RESCAN_MAX_S)
                self._interval = longer if same else self._rescan_s
                self._last_listing = found
        # an object in a store appears whole once uploaded, and its time is the store's clock: no settling
        now_ns = time.time_ns() if not remote else float("inf")
        due: list[Span] = []
        with self._lock:
            self._runs = runs
            self._unreadable = unreadable
            seen = set()
            for run in runs:
                for f in run.files:
                    seen.add(f.path)
                    span = self._spans.get(f.path)
                    if span is None or span.stamp != (f.size, f.mtime_ns):
                        if span is not None and span.state == LOADING:
                            continue  # rewritten while loading: rescanned once that load ends
                        span = self._spans[f.path] = Span(file=f)
                        self._changes += 1
                    if span.state == PENDING and now_ns - f.mtime_ns >= self._settle_s * 1e9:
                        span.state = LOADING
                        self._changes += 1
                        due.append(span)
            for path in list(self._spans):
                if path not in seen and self._spans[path].state != LOADING:
                    del self._spans[path]
                    self._changes += 1
        # Spans with a cached analysis (beside the run, or written at the source by the training job)
        # load here in a moment each; only the others go to a worker process to be read.
        listed = self._listed_beside(runs, due) if remote else None
        due = [span for span in due if span.state == LOADING]
        done = 0  # a store's entries: a batch fetched at once while the one before is decoded
        for batch, prefetched in cache.prefetched_batches([span.file for span in due], listed):
            for span in due[done : done + len(batch)]:
                analysis = cache.load(span.file, prefetched, listed)
                with self._lock:
                    if analysis is not None:
                        span.state, span.analysis, span.error = READY, analysis, problems_of(analysis)
                        self._changes += 1
                    elif not self._closed:
                        self._submit(span)
            done += len(batch)

    def _listed_beside(self, runs: list[Run], due: list[Span]) -> dict[str, storage.Entry] | None:
        """A store's objects beside the traces of ``due``, for `cache.prefetch`: those its listing
        found in the analysis folders, and those of each folder it left out (`Run.analyses_apart`),
        listed now, only where a span of that run has no copy of its entry in the user cache made
        for its trace as listed (`cache.kept_for`; those spans are loaded from it here). A folder
        that cannot be listed leaves its spans pending, for the next scan."""
        listed = {url: obj for run in runs for url, obj in run.stored.items()}
        apart = {run.name: run.analyses_apart for run in runs if run.analyses_apart}
        needed: dict[str, list[Span]] = {}
        for span in due:
            folder = apart.get(span.file.run)
            if folder is None:
                continue
            analysis = cache.kept_for(span.file)
            with self._lock:
                if analysis is not None:
                    span.state, span.analysis, span.error = READY, analysis, problems_of(analysis)
                    self._changes += 1
                else:
                    needed.setdefault(folder, []).append(span)
        for folder, spans in needed.items():
            try:
                listed.update((obj.url, obj) for obj in storage.listing(folder))
            except (OSError, ValueError, storage.StorageError) as e:
                logger.warning("phaseprof: %s", storage.cannot_list(folder, e))
                with self._lock:
                    for span in spans:
                        span.state = PENDING
                    self._changes += 1
        return listed

    def refresh_soon(self, force: bool = False) -> None:
        """`refresh` on a thread of its own, for callers that must not wait (TensorBoard's plugin
        listing); nothing is started while a scan runs or is not due."""
        with self._lock:
            due = force or time.monotonic() - self._scanned_at >= self._interval
            if self._closed or self._scanning or not due:
                return
            self._scanning = True

        def scan() -> None:
            try:
                self._refresh(force)
            finally:
                with self._lock:
                    self._scanning = False

        threading.Thread(target=scan, name="phaseprof-scan", daemon=True).start()

    def _submit(self, span: Span) -> None:
        if self._pool is None:
            from .loading import LoaderPool, load

            loader = functools.partial(load, beside=self._beside)
            self._pool = LoaderPool(self._done, self._processes, target=loader, backlog=True)
        span.state = LOADING
        self._pool.submit(span, span.file)

    def _done(self, span: Span, state: str, result) -> None:
        with self._lock:
            self._changes += 1
            if state == READY:
                span.state, span.analysis, span.error = READY, result, problems_of(result)
            else:
                span.state, span.error = ERROR, result

    # --- queries ----------------------------------------------------------------------------------

    def runs(self) -> list[Run]:
        with self._lock:
            return list(self._runs)

    def unreadable(self) -> list[tuple[str, str]]:
        """Directories under the logdir the last scan could not list: (path relative to the logdir, why)."""
        with self._lock:
            found = list(self._unreadable)
        root = os.path.realpath(self.logdir)
        return [(display(os.path.relpath(path, root)), why) for path, why in found]

    def logdir_error(self) -> str | None:
        """Why the last scan could not list the logdir at all (one line naming it), or None."""
        return self._logdir_error

    def run(self, name: str) -> Run | None:
        return next((r for r in self.runs() if r.name == name), None)

    def span(self, f: TraceFile) -> Span:
        with self._lock:
            return self._spans.get(f.path) or Span(file=f)

    def analyses(self, run: Run, worker: str) -> list[SpanAnalysis]:
        """The loaded analyses of a worker's spans, in span order."""
        files = run.workers.get(worker, [])
        with self._lock:
            spans = [self._spans.get(f.path) for f in files]
        return [s.analysis for s in spans if s is not None and s.analysis is not None]

    def version(self, run: Run, worker: str) -> tuple:
        """Changes whenever a span of the worker is added, reloaded or finishes loading."""
        with self._lock:
            return tuple((f.path, *(s.stamp if (s := self._spans.get(f.path)) else ()),
                          s.state if s else None) for f in run.workers.get(worker, []))

    def worker(self, run: Run, worker: str) -> Worker:
        """The analysis of a worker's loaded spans as one `Worker`, built once per version."""
        return self.derived(run, worker, None)

    def derived(self, run: Run, worker: str, compute: Callable[..., T] | None, *params) -> T:
        """``compute(the worker's analysis, *params)``, cached until the worker's version changes, so
        that a request derives its answer from one analysis computed once."""
        key = (run.name, worker, compute, params)
        with self._lock:
            version = self.version(run, worker)
            hit = self._derived.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
            analyses = self.analyses(run, worker)
        value = Worker(worker, analyses) if compute is None else compute(self.worker(run, worker), *params)
        with self._lock:
            self._derived[key] = (version, value)
        return value

    def of_run(self, run: Run, compute: Callable[..., T], *params) -> T:
        """``compute(the run's name, the `Worker` of each worker with a loaded span, *params)``, cached
        until a span of the run is added, reloaded or finishes loading: a figure over every rank (a
        second at a thousand ranks) is made once per change of the run, not once per request. Asked
        again with no span of the store changed since, not even the workers' versions are compared
        (7 ms at a thousand workers on a busy machine)."""
        key = (run.name, compute, params)
        with self._lock:
            hit = self._derived.get(key)
            if hit is not None and hit[0][0] == self._changes:
                return hit[1]
            version = tuple(self.version(run, name) for name in run.workers)
            if hit is not None and hit[0][1] == version:  # other runs changed, not this one
                self._derived[key] = ((self._changes, version), hit[1])
                return hit[1]
            changes = self._changes
        workers = [w for w in (self.worker(run, name) for name in run.workers) if w.spans]
        value = compute(run.name, workers, *params)
        with self._lock:
            self._derived[key] = ((changes, version), value)
        return value

    def step_trace(self, f: TraceFile, number: int) -> bytes | None:
        """Step ``number`` of span ``f`` as Chrome-trace JSON (None if the span has no such step), cut
        out of the file by a worker process (TensorBoard keeps no events) and kept for the next asks.
        Raises `TraceError` if the file can no longer be read."""
        key = (f.path, f.size, f.mtime_ns, number)
        with self._lock:
            if key in self._traces:
                self._traces.move_to_end(key)
                return self._traces[key]
        try:  # from the step index written when the trace was analysed: a read of the step's range
            body = step_index.step_trace(f, number)
        except step_index.Unusable:
            pass
        else:
            self._keep(key, body)
            return body
        with self._lock:
            waiting = self._trace_waits.get(key)
            if waiting is None:
                waiting = self._trace_waits[key] = (threading.Event(), [])
                if self._trace_pool is None:
                    from .loading import LoaderPool

                    cut = functools.partial(cut_step, beside=self._beside)
                    self._trace_pool = LoaderPool(self._trace_done, 1, target=cut)
                self._trace_pool.submit(key, (f, number))
        event, outcome = waiting
        event.wait()
        state, result = outcome
        if state != "ready":
            raise TraceError(f.path, result)
        return result

    def _trace_done(self, key: tuple, state: str, result) -> None:
        with self._lock:
            if key not in self._trace_waits:
                return  # closed meanwhile
            event, outcome = self._trace_waits.pop(key)
            outcome[:] = [state, result]
            if state == "ready":
                self._keep(key, result)
        event.set()

    def _keep(self, key: tuple, body: bytes | None) -> None:
        """Keep a step's trace for the next asks, the oldest dropped beyond the budget."""
        with self._lock:
            self._trace_bytes += len(body or b"") - len(self._traces.pop(key, None) or b"")
            self._traces[key] = body
            while self._trace_bytes > TRACE_CACHE_BYTES and len(self._traces) > 1:
                self._trace_bytes -= len(self._traces.popitem(last=False)[1] or b"")

    def progress(self) -> Loading:
        with self._lock:
            spans = list(self._spans.values())
        done = [s for s in spans if s.state in (READY, ERROR)]
        return Loading(files=len(spans), done=len(done), bytes=sum(s.file.size for s in spans),
                       bytes_done=sum(s.file.size for s in done))

    def has_traces(self) -> bool:
        return any(r.files for r in self.runs())

    def wait(self, timeout: float) -> bool:
        """Block until no scan runs and nothing is pending or loading (tests, benchmarks); True if so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.refresh(force=True)
            with self._lock:
                busy = self._scanning or self._scanning_store or any(
                    s.state in (PENDING, LOADING) for s in self._spans.values())
            if not busy:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = [self._pool, self._trace_pool]
            self._pool = self._trace_pool = None
            waits, self._trace_waits = list(self._trace_waits.values()), {}
        for event, outcome in waits:  # nobody waits for a trace that will not come
            outcome[:] = ["error", "TensorBoard is shutting down"]
            event.set()
        for pool in pools:
            if pool is not None:
                pool.close()
