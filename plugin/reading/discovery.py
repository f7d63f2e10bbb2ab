"""Find runs, workers and spans under a logdir (docs/architecture.md).

A run is a directory holding trace files (the logdir itself is run ``.``); a worker is the part of a
trace file name before the span timestamp; each file is one span (one active cycle of the profiler
schedule). Nothing outside the root is read: symbolic links that lead out of it are skipped.
Names are shown as `display` makes them (a name that is not UTF-8 is escaped); the path to open
keeps the file system's own bytes.
"""

from __future__ import annotations

import os
import stat

import msgspec
from zlib_ng import zlib_ng as zlib

from phaseprof.contract import ANALYSIS_DIR, EVENT_FILE_MARKER, JSON_FILE_RE, RANK_SCALARS_RE, TRACE_FILE_RE

from . import storage

#: How much of a JSON file without the trace suffix is read to decide whether it is a trace.
_SNIFF_BYTES = 4096


def display(name: str) -> str:
    """``name`` as it can be shown and sent anywhere, on one line: bytes that are not UTF-8 (which
    Python keeps as lone surrogates) and control characters are written as escapes (``\\xff``,
    ``\\n``)."""
    if name.isascii() and name.isprintable():
        return name
    name = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)


class TraceFile(msgspec.Struct, frozen=True):
    run: str  # directory relative to the root, "." for the root itself (displayable)
    worker: str  # (displayable)
    path: str  # absolute, real path, to open (may hold undecodable bytes)
    name: str  # file name (displayable)
    size: int
    mtime_ns: int
    #: A trace in a store: its ETag as listed ("" where the store gave none, and on a disk); what
    #: the user cache's copy of its analysis is kept for (`cache.kept_for`).
    etag: str = ""


class Run(msgspec.Struct, dict=True):
    name: str  # displayable
    path: str  # to open
    files: list[TraceFile] = msgspec.field(default_factory=list)
    has_scalars: bool = False  # holds TensorBoard event files (per-step timings)
    #: Per-rank scalars of a distributed run: rank -> its folder (``<run>/rank<N>/``, `RANK_SCALARS_RE`).
    rank_scalars: dict[int, str] = msgspec.field(default_factory=dict)
    #: A run in a store: the objects its listing found in the run's analysis folder, by URL (what the
    #: cache of analyses may fetch there, and the ETag its user-cache copy of each is kept under).
    stored: dict[str, storage.Entry] = msgspec.field(default_factory=dict)
    #: A run in a store whose listing left its analysis folder out (`storage.listing_apart`): the
    #: folder's URL, to list on its own when a span needs its entry ("": none, or in `stored`).
    analyses_apart: str = ""

    def scalar_dirs(self) -> list[tuple[int | None, str]]:
        """(rank, folder) of every set of per-step scalars of the run: its own (rank None), then each
        rank's in rank order."""
        own = [(None, self.path)] if self.has_scalars else []
        return own + sorted(self.rank_scalars.items())

    @property
    def workers(self) -> dict[str, list[TraceFile]]:
        """Trace files per worker, each worker's spans in name (time) order (grouped once: a run of
        a thousand ranks is asked this for each of them)."""
        cached = self.__dict__.get("_workers")
        if cached is None or cached[0] != len(self.files):
            out: dict[str, list[TraceFile]] = {}
            for f in sorted(self.files, key=lambda f: f.name):
                out.setdefault(f.worker, []).append(f)
            cached = self.__dict__["_workers"] = (len(self.files), out)
        return cached[1]


def within(root: str, path: str) -> bool:
    """Whether ``path`` (after resolving links) lies inside ``root``."""
    root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def discover(root: str, unreadable: list[tuple[str, str]] | None = None) -> list[Run]:
    """Runs under ``root`` (a directory or one trace file), in name order. A directory that cannot
    be listed (no permission, say) is added to ``unreadable`` as (its real path, why), so that it is
    reported rather than silently missing; the others are still read."""
    if storage.is_remote(root):
        try:
            return _discover_remote(storage.normalize(root))
        except (OSError, ValueError) as e:  # the store did not answer, or refused the listing
            if unreadable is None:
                raise
            unreadable.append((root, f"cannot list it ({e})"))
            return []
    root = os.path.realpath(root)

    def cannot_list(e: OSError) -> None:
        if unreadable is not None:
            unreadable.append((e.filename if isinstance(e.filename, str) else root,
                               f"cannot read the directory ({e.strerror or e})"))

    if os.path.isfile(root):
        directory, name = os.path.split(root)
        f = _trace_file(directory, name, ".", force=True)
        return [Run(name=".", path=directory, files=[f] if f else [])]
    runs: dict[str, Run] = {}
    for directory, subdirs, files in os.walk(root, onerror=cannot_list, followlinks=False):
        subdirs[:] = sorted(d for d in subdirs if d != ANALYSIS_DIR)
        rel = display(os.path.relpath(directory, root))
        run = None
        for name in sorted(files):
            full = os.path.join(directory, name)
            if os.path.islink(full) and not within(root, full):  # the walk itself never leaves the root
                continue
            if EVENT_FILE_MARKER in name:
                run = run or runs.setdefault(rel, Run(name=rel, path=directory))
                run.has_scalars = True
                continue
            f = _trace_file(directory, name, rel)
            if f is not None:
                run = run or runs.setdefault(rel, Run(name=rel, path=directory))
                run.files.append(f)
    return _fold_rank_scalars(runs, os.path.dirname)


def _fold_rank_scalars(runs: dict[str, Run], parent_of) -> list[Run]:
    """The runs in name order, a rank's folder of scalars with no trace in it made part of its run,
    not a run of its own (``parent_of``: the folder holding a run's folder)."""
    for name in sorted(runs, key=len, reverse=True):
        r = runs[name]
        m = RANK_SCALARS_RE.match(os.path.basename(name))
        if name == "." or not m or r.files or r.rank_scalars or not r.has_scalars:
            continue
        parent = os.path.dirname(name) or "."
        owner = runs.setdefault(parent, Run(name=parent, path=parent_of(r.path)))
        owner.rank_scalars[int(m.group("rank"))] = r.path
        del runs[name]
    return [runs[k] for k in sorted(runs)]


def _discover_remote(root: str) -> list[Run]:
    """`discover` for a logdir in an object store: one listing of its prefix, the analysis folders
    left out where the store can (`storage.listing_apart`); only when that holds nothing is the URL
    asked about as one object (a trace file named by the user)."""
    entries, apart = storage.listing_apart(root, ANALYSIS_DIR)
    if not entries and not apart:
        one = storage.info(root)
        if one is not None:  # the URL of one trace file
            name = storage.basename(root)
            f = _remote_trace_file(one, name, ".", force=True)
            return [Run(name=".", path=storage.dirname(root), files=[f] if f else [])]
    runs: dict[str, Run] = {}
    stored: dict[str, dict[str, storage.Entry]] = {}  # run name -> the objects of its analysis folder
    for entry in entries:
        rel = storage.relpath(entry.url, root)
        directory, _, name = rel.rpartition("/")
        if ANALYSIS_DIR in directory.split("/"):
            owner, _, folder = directory.rpartition("/")
            if folder == ANALYSIS_DIR:
                stored.setdefault(display(owner or "."), {})[entry.url] = entry
            continue
        run_name = display(directory or ".")
        run_path = storage.join(root, directory) if directory else root
        if EVENT_FILE_MARKER in name:
            runs.setdefault(run_name, Run(name=run_name, path=run_path)).has_scalars = True
            continue
        f = _remote_trace_file(entry, name, run_name)
        if f is not None:
            runs.setdefault(run_name, Run(name=run_name, path=run_path)).files.append(f)
    for name, objects in stored.items():
        if name in runs:
            runs[name].stored = objects
    for folder in apart:
        owner = storage.dirname(folder)
        name = display(storage.relpath(owner, root))
        if name in runs:
            runs[name].analyses_apart = folder
    return _fold_rank_scalars(runs, storage.dirname)


def _remote_trace_file(entry: storage.Entry, name: str, run: str, *, force: bool = False) -> TraceFile | None:
    m = TRACE_FILE_RE.match(name)
    if m:
        worker = m.group("worker") or name
    else:
        m = JSON_FILE_RE.match(name)
        if not force and not (m and _head_looks_like_trace(storage.read_head(entry.url, _SNIFF_BYTES))):
            return None
        worker = m.group("worker") if m else name
    return TraceFile(run=run, worker=display(worker), path=entry.url, name=display(name), size=entry.size,
                     mtime_ns=entry.mtime_ns, etag=entry.etag)


def _trace_file(directory: str, name: str, run: str, *, force: bool = False) -> TraceFile | None:
    """The trace file ``name``, or None if it is not one. ``force``: the user named this file."""
    path = os.path.join(directory, name)
    m = TRACE_FILE_RE.match(name)
    if m:
        worker = m.group("worker") or name
    else:
        m = JSON_FILE_RE.match(name)
        if not force and not (m and _looks_like_trace(path)):
            return None
        worker = m.group("worker") if m else name
    try:
        st = os.stat(path)  # a FIFO or device named like a trace is listed: reading it reports what it is
    except OSError:
        return None
    real = os.path.realpath(path) if os.path.islink(path) else path
    return TraceFile(run=run, worker=display(worker), path=real, name=display(name), size=st.st_size,
                     mtime_ns=st.st_mtime_ns)


def _looks_like_trace(path: str) -> bool:
    """A JSON file is taken for a trace if its first bytes hold Chrome-trace keys."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the scan
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            head = os.read(fd, _SNIFF_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return False
    return _head_looks_like_trace(head)


def _head_looks_like_trace(head: bytes) -> bool:
    try:
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(wbits=31).decompress(head, _SNIFF_BYTES)
    except zlib.error:
        return False
    return b'"traceEvents"' in head or (b'"ph"' in head and head.lstrip()[:1] == b"[")
