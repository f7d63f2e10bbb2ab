"""The cache of trace analyses: a trace read once is never decoded again while it is unchanged.

An entry holds one span's `SpanAnalysis` as msgpack (msgspec, arrays as raw bytes), behind a header
naming what it was made from: the trace's path, size and modification time, and the analysis
version (a digest of the reading and analysis code and of the file contract, so any change to them
retires every entry).
An entry is used only when all of these match the trace as it is now, its bytes match the checksum
it carries, and its analysis holds together (`consistent`); a stale, foreign or corrupt entry is
ignored (and overwritten by the next analysis), never trusted, and an entry is never read through a
symbolic link (which could lead out of the logdir). Entries keep the ops' input shapes, so that one
entry serves every reader (the report, the step detail, TensorBoard).

The analysis version retires the *content* of entries made by other code; the file's first line
names its *format* (``phaseprof-analysis 1.0``, `FORMAT`; the rule is `phaseprof.formats`'s): fields
a newer minor version added are ignored, and an entry of another major version (a newer phaseprof
sharing the logdir) is not used: the trace is read again, and the log says so, one line per major
version. An entry without a format (first line ``phaseprof-analysis-deflated``, written before
entries said theirs) is format 1.0.

Where entries live, first found first used:

* beside the run: ``<run>/.phaseprof/<trace file name>.analysis``, when that directory is writable.
  The entry sits next to its trace, so its key is the trace's file name (the logdir may be moved or
  mounted elsewhere); the training side writes these too, at the source;
* the user's cache directory (``$XDG_CACHE_HOME/phaseprof``, ``~/Library/Caches/phaseprof``,
  ``%LOCALAPPDATA%\\phaseprof\\Cache``) for logdirs the user cannot write, keyed by the trace's
  real path.

An entry in an object store (written at the source, uploaded with its trace) is fetched once: the
bytes fetched are kept in the user's cache directory (``store/<digest of its URL>.copy``, a line
naming the format, the object's size and ETag and those of the trace it was fetched beside, then its
bytes), and read from there while the store's listing gives the same ETag and size (`prefetch`)
or, without a listing of the analysis folder, the trace's listing gives its trace's (`kept_for`),
so that a viewer started again on a bucket only lists its traces.

``PHASEPROF_CACHE=off`` turns the cache off (nothing read, nothing written); ``PHASEPROF_CACHE=<dir>``
uses ``<dir>`` instead of the user's cache directory. A read-only reader (``beside=False``:
TensorBoard with ``--phaseprof_read_only``, or a reader with ``PHASEPROF_READ_ONLY=1``, `read_only`)
writes nothing under the logdir: its entries go to the user's cache directory only, and entries
beside the run are still read. A writer of the logdir (the training job, ``phaseprof cache``) writes
beside the run whatever the variable says.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import struct
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import msgspec
import numpy as np
from zlib_ng import zlib_ng as zlib

from phaseprof import contract, formats
from phaseprof.contract import ANALYSIS_DIR

from .analysis.model import SpanAnalysis
from .reading import storage
from .reading.discovery import TraceFile
from .reading.errors import TraceError
from .reading.file_bytes import read_regular

logger = logging.getLogger(__name__)

SUFFIX = ".analysis"
_MAGIC = b"phaseprof-analysis\n"
#: The format of the entries this phaseprof writes, "major.minor" (`phaseprof.formats`).
FORMAT = "1.0"
MAJOR = 1
#: An entry as stored: a line naming it and its format, then the entry compressed (a fifth of its
#: size: what a viewer of a logdir in an object store downloads per trace).
_STORED = b"phaseprof-analysis "
_HEAD = _STORED + FORMAT.encode() + b"\n"
#: The first line of an entry written before entries said their format (format 1.0).
_UNVERSIONED = b"phaseprof-analysis-deflated\n"
#: The longest first line read (a forged entry may have none).
_MAX_LINE = 64
_ARRAY = 1  # msgpack extension code of a numpy array
#: Each entry carries a digest of its bytes (BLAKE2b): a flipped bit anywhere is caught, and the trace
#: read again, where msgpack alone would decode many a damaged entry into other figures.
_CHECKSUM_BYTES = 16
#: An entry larger than this is not read (real ones are a few hundred KiB to a few MiB).
_MAX_ENTRY_BYTES = 256 << 20


class Key(msgspec.Struct, frozen=True):
    """What an entry was computed from; the entry is valid only for exactly this."""

    path: str  # the trace's file name beside the run, its real path in the user's cache directory
    size: int
    mtime_ns: int
    version: str


class Entry(msgspec.Struct):
    key: Key
    analysis: SpanAnalysis


#: Set (to anything but "" or "0"), the readers (TensorBoard, ``phaseprof report`` and ``compare``)
#: write nothing under the logdir (see docs/security.md).
READ_ONLY_ENV = "PHASEPROF_READ_ONLY"


def read_only() -> bool:
    """Whether the environment makes the readers read-only (`READ_ONLY_ENV`)."""
    return os.environ.get(READ_ONLY_ENV, "") not in ("", "0")


def enabled() -> bool:
    return os.environ.get("PHASEPROF_CACHE", "").lower() not in ("off", "0", "no", "false")


def prefetch(files: list[TraceFile], listed: dict[str, storage.Entry] | None = None) -> dict[str, bytes]:
    """The entries beside those of ``files`` that lie in an object store, fetched at once (many requests
    in flight, not one after the other), by entry path, for `load`; local files are read by `load`.

    ``listed``: the objects the store's listing found beside the traces (`Run.stored`). Then only
    those are asked for, and one the user's cache keeps a copy of, of the same ETag and size (`kept`),
    is read from there: a second viewer of a bucket fetches nothing again, only lists it."""
    if not enabled():
        return {}
    traces = {places(f)[0][0]: f for f in files if storage.is_remote(f.path)}
    if listed is None:
        return storage.read_many(list(traces), _MAX_ENTRY_BYTES) if traces else {}
    found = {}
    for path, f in traces.items():
        copy = kept(listed[path]) if path in listed else None
        if copy is not None:
            found[path] = copy[1]
            if copy[0] != (f.size, f.etag):  # kept before copies named their trace, or for another
                keep(listed[path], copy[1], f)
    missing = [path for path in traces if path in listed and path not in found]
    fetched = storage.read_many(missing, _MAX_ENTRY_BYTES) if missing else {}
    for path, data in fetched.items():
        keep(listed[path], data, traces[path])
    return found | fetched


def kept_for(f: TraceFile) -> SpanAnalysis | None:
    """The analysis of ``f``, a trace in a store, from the user cache's copy of the entry beside it,
    if that copy was fetched for a trace of ``f``'s ETag and size: ``f``'s analysis folder need not
    be listed (`storage.listing_apart`). The trace's ETag changes with its content; the entry's is
    not asked for (one of the same trace holds the same figures: `load` checks its key and
    version)."""
    if not enabled() or not f.etag or not storage.is_remote(f.path):
        return None
    path = places(f)[0][0]
    copy = _copy(path)
    if copy is None or copy[2] != (f.size, f.etag):
        return None
    size, etag, _, data = copy
    return load(f, {path: data}, {path: storage.Entry(url=path, size=size, mtime_ns=0, etag=etag)})


#: The first line of a copy of a store's object in the user's cache: its format (`COPY_FORMAT`, by
#: `phaseprof.formats`'s rule), then JSON: the object's size and ETag, and (1.1) the size and ETag
#: of the trace it was fetched for; then the object's bytes.
_COPY = b"phaseprof-store-copy "
COPY_FORMAT, COPY_MAJOR = "1.1", 1
#: The longest first line of a copy read (two ETags: a store may make them long).
_MAX_COPY_LINE = 1024


def _copy_path(url: str) -> str | None:
    user = user_cache_dir()
    if not user:
        return None
    digest = hashlib.blake2b(url.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return os.path.join(user, "store", digest + ".copy")


def keep(obj: storage.Entry, data: bytes, trace: TraceFile | None = None) -> None:
    """Keep ``data``, the object ``obj`` of a store as fetched, in the user's cache (replacing the
    copy of an earlier version), with the ETag and size of the ``trace`` it was fetched beside: only
    where the store gave an ETag and ``data`` is of the listed size."""
    path = _copy_path(obj.url) if obj.etag else None
    if path is not None and len(data) == obj.size:
        stamp = [trace.size, trace.etag] if trace is not None and trace.etag else []
        head = msgspec.json.encode([obj.size, obj.etag, *stamp])
        write_whole(path, _COPY + COPY_FORMAT.encode() + b" " + head + b"\n" + data)


def kept(obj: storage.Entry) -> tuple[tuple[int, str] | None, bytes] | None:
    """The user cache's copy of the store's object ``obj`` if it is of ``obj``'s ETag and size: the
    (size, ETag) of the trace it was fetched for (None where the copy does not say) and its bytes."""
    copy = _copy(obj.url)
    if copy is None or copy[:2] != (obj.size, obj.etag):
        return None
    return copy[2], copy[3]


def _copy(url: str) -> tuple[int, str, tuple[int, str] | None, bytes] | None:
    """The user cache's copy of the store's object at ``url``: its size, ETag, the (size, ETag) of
    the trace it was fetched for (None if it does not say: 1.0), and its bytes; None if there is
    none, or it is damaged or of another major format."""
    path = _copy_path(url)
    if path is None:
        return None
    try:
        data = read_regular(path, _MAX_ENTRY_BYTES + _MAX_COPY_LINE, follow_links=False)
    except TraceError:
        return None
    end = data.find(b"\n")
    if not data.startswith(_COPY) or end < 0:
        return None
    found, _, head = data[len(_COPY):end].partition(b" ")
    try:
        formats.check(found.decode("ascii", "replace"), COPY_MAJOR)
        size, etag, *trace = msgspec.json.decode(head, type=list[int | str])
    except (msgspec.DecodeError, formats.OtherFormat, ValueError):
        return None
    if not (isinstance(size, int) and isinstance(etag, str) and len(trace) in (0, 2)):
        return None
    body = data[end + 1:]
    if len(body) != size:
        return None
    return size, etag, (tuple(trace) if trace else None), body


#: Entries of a store fetched in one batch of concurrent requests (`prefetched_batches`).
PREFETCH_BATCH = 200


def prefetched_batches(files: list[TraceFile], listed: dict[str, storage.Entry] | None = None
                       ) -> Iterator[tuple[list[TraceFile], dict[str, bytes]]]:
    """``files`` in batches, each with `prefetch`'s entries (``listed``: as `prefetch`'s): the next
    batch's requests are in flight while the caller loads this one's, so that waiting for a store and
    decoding overlap (and the first spans of a large logdir load before the last are fetched)."""
    batches = [files[i : i + PREFETCH_BATCH] for i in range(0, len(files), PREFETCH_BATCH)]
    if not batches:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="phaseprof-prefetch") as pool:
        ahead = pool.submit(prefetch, batches[0], listed)
        for i, batch in enumerate(batches):
            got = ahead.result()
            if i + 1 < len(batches):
                ahead = pool.submit(prefetch, batches[i + 1], listed)
            yield batch, got


def load(f: TraceFile, prefetched: dict[str, bytes] | None = None,
         listed: dict[str, storage.Entry] | None = None) -> SpanAnalysis | None:
    """The cached analysis of ``f``, or None when there is no valid entry (``prefetched``: `prefetch`'s;
    ``listed``: as `prefetch`'s, an entry in a store that its listing did not find is not asked for)."""
    if not enabled():
        return None
    for path, key_path in places(f):
        if listed is not None and path not in listed and storage.is_remote(path):
            continue
        try:  # the logdir is written by others: a FIFO or a huge file here must not stall a reader
            data = (prefetched[path] if prefetched and path in prefetched
                    else read_regular(path, _MAX_ENTRY_BYTES, follow_links=False))
        except TraceError:
            continue
        try:
            entry = _decode(data)
        except formats.OtherFormat as e:
            formats.tell_once(logger, "an analysis entry", path, e)
            continue
        except Exception:  # noqa: BLE001 - corrupt, truncated or from another layout: ignored
            continue
        k = entry.key
        # An object store sets an object's time when it is uploaded, after the training side wrote its
        # entry: beside a trace in a store, an entry is valid for its name and size (objects are written
        # whole, once).
        mtime_ns = k.mtime_ns if storage.is_remote(path) else f.mtime_ns
        if (k.path, k.size, k.mtime_ns, k.version) != (key_path, f.size, mtime_ns, version()):
            continue
        # (a trace in a store was just listed: asking the store again would cost a request per trace)
        if (storage.is_remote(f.path) or unchanged(f)) and consistent(entry.analysis):
            entry.analysis.file = f.name
            entry.analysis.worker = f.worker
            return entry.analysis
    return None


def consistent(a: SpanAnalysis) -> bool:
    """Whether an analysis read from an entry holds together: arrays of numbers sized by its steps,
    phases and devices, tables of finite numbers in columns of one length, sorted by step, codes that
    index the lists they name, and counts of calls that are counts (at least one: figures are divided
    by them). An entry sits in a logdir others write; one that passes this can show wrong figures (as a
    forged trace can) but cannot make a reader fail."""
    steps, phases, devices = len(a.steps), len(a.phases), len(a.memory_devices)
    if not all(math.isfinite(s.start) and math.isfinite(s.end) and all(map(math.isfinite, s.apart.values()))
               for s in a.steps):
        return False
    g = a.gpu
    grids = [(x, (steps, phases)) for x in (a.host_us, a.gpu_us, a.gpu_idle_us, a.launches, a.wait_us,
                                           g.busy_us, g.compute_us, g.comm_us, g.exposed_us, a.untraced_us)]
    grids += [(g.window_us, (steps,)), (g.past_host_us, (steps,)), (g.stream_busy_us, (steps, len(g.streams)))]
    grids += [(g.window_start_us, (steps,)), (g.memory_us, (steps, phases)),
              (g.memory_exposed_us, (steps, phases)),
              (g.memory_kind_us, (steps, len(g.memory_kinds)))]
    q = a.queues
    grids += [(x, (steps, len(q.streams))) for x in (q.mean, q.max, q.delay_p50_us, q.delay_p90_us)]
    grids.append((q.phase_queued_us, (steps, phases)))
    per_device = (steps, phases, max(devices, 1))  # one column of "no event" when the trace has no device
    grids += [(a.step_gpu_us, (steps,)), (a.step_gpu_idle_us, (steps,)),
              (a.memory_peak, per_device), (a.memory_delta, per_device),
              (a.apart_gpu_us, (steps, len(contract.OUT_OF_STEP)))]
    # NaN is a grid's "no figure" (GPU idle time of a trace without a GPU); infinities are no figure at all
    if any(x.dtype.kind not in "iuf" or x.shape != shape or np.isinf(x).any() for x, shape in grids):
        return False
    names, shapes, lanes = len(a.names), len(a.shapes), len(a.lanes.labels)
    tables = [  # (table, its code columns and the length of the list each indexes)
        (a.ops, [("phase", phases), ("name", names), ("shapes", shapes)]),
        (a.kernels, [("phase", phases), ("name", names), ("op", names)]),
        (a.memory_curve, [("device", devices)]),
        (a.lanes, [("lane", lanes), ("phase", phases)]),
        (a.apart, [("kind", len(contract.OUT_OF_STEP))]),
        (a.blocking, [("phase", phases), ("call", names), ("shapes", shapes)]),
    ]
    for table, codes in tables:
        columns = [getattr(table, k) for k in table.__struct_fields__ if k != "labels"]
        rows = len(table.step)
        if any(c.ndim != 1 or len(c) != rows or c.dtype.kind not in "iuf" or not _finite(c) for c in columns):
            return False
        if rows and not _codes_within(table.step, steps) or (np.diff(table.step) < 0).any():
            return False
        if rows and not all(_codes_within(getattr(table, k), n) for k, n in codes):
            return False
    b = a.blocking  # codes that may be -1 ("none"), else within what they index
    optional = ((b.copy, names), (b.op, names), (b.stack, len(a.call_paths.parent)),
                (b.queue_stream, len(q.streams)))
    if not all(((c >= -1) & (c < n)).all() for c, n in optional):
        return False
    return (all((t.calls >= 1).all() for t in (a.ops, a.kernels)) and _launches_hold(a.kernels)
            and _code_holds(a))


def _code_holds(a: SpanAnalysis) -> bool:
    """The call paths and the module table: codes within what they index (a path's parent earlier
    than itself, so walking up a stack ends), columns of one length, calls that are counts."""
    p, m = a.call_paths, a.modules
    nodes, modules, names = len(p.parent), len(m.paths), len(a.names)
    if len(p.name) != nodes or (nodes and not (_codes_within(p.name, names)
                                               and ((p.parent >= -1) & (p.parent < np.arange(nodes))).all())):
        return False
    if len(a.ops.step) and not ((a.ops.stack >= -1) & (a.ops.stack < nodes)).all():
        return False
    if len(m.parent) != modules or (modules and not ((m.parent >= -1) & (m.parent < np.arange(modules))).all()):
        return False
    for columns in ((m.step, m.module, m.calls, m.forward_us, m.forward_self_us, m.forward_gpu_us, m.backward_us,
                     m.backward_gpu_us),
                    (m.op_step, m.op_module, m.op_name, m.op_backward, m.op_calls, m.op_us, m.op_gpu_us)):
        if any(c.ndim != 1 or len(c) != len(columns[0]) or c.dtype.kind not in "iufb" or not _finite(c)
               for c in columns):
            return False
    steps = len(a.steps)
    if len(m.step) and not (_codes_within(m.step, steps) and _codes_within(m.module, modules)
                            and (m.calls >= 1).all()):
        return False
    return not len(m.op_step) or bool(_codes_within(m.op_step, steps) and _codes_within(m.op_module, modules)
                                      and _codes_within(m.op_name, names) and (m.op_calls >= 1).all())


def _launches_hold(k) -> bool:
    """The kernels' launch figures: weights within the device time they weigh, means within their
    range (occupancy a percentage), and -1 ("not recorded") the only negative launch value."""
    slack = 1e-6 * (1 + k.us)
    return bool(
        all(((w >= 0) & (w <= k.us + slack)).all() for w in (k.blocks_per_sm_weight_us, k.occupancy_weight_us))
        and (k.blocks_per_sm_us >= 0).all() and (k.occupancy_us >= 0).all()
        and (k.occupancy_us <= 100 * k.occupancy_weight_us + slack).all()
        and all((c >= -1).all() for c in (k.grid, k.block, k.registers, k.shared_memory)))


def _finite(x: np.ndarray) -> bool:
    return x.dtype.kind != "f" or bool(np.isfinite(x).all())


def _codes_within(codes: np.ndarray, n: int) -> bool:
    return codes.dtype.kind in "iu" and int(codes.min()) >= 0 and int(codes.max()) < n


def store(f: TraceFile, analysis: SpanAnalysis, beside: bool = True) -> str | None:
    """Write ``analysis`` (read with input shapes) as the entry of ``f``: beside the run when
    writable and ``beside``, else in the user's cache directory. Returns where, or None; never
    raises (no cache, no harm)."""
    if not enabled() or not unchanged(f):
        return None  # changed while it was being analysed: the analysis is of neither version
    for path, key_path in places(f, SUFFIX, beside):
        data = _encode(Entry(Key(key_path, f.size, f.mtime_ns, version()), analysis))
        if write_whole(path, data):
            return path
    return None


def write_whole(path: str, data: bytes) -> bool:
    """Write ``path`` whole or not at all (readers never see half an entry). A viewer writes nothing
    into an object store: entries of traces there go to the user's cache directory."""
    if storage.is_remote(path):
        return False
    part = f"{path}.{os.getpid()}.part"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # a new file, never through a link someone left at that name (it could lead out of the logdir)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(part, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)
        return False


def places(f: TraceFile, suffix: str = SUFFIX, beside: bool = True) -> list[tuple[str, str]]:
    """(entry path, key path) where ``f``'s entry (the analysis, or another file ending in ``suffix``) may
    be: beside the run (unless not ``beside``: a read-only reader's), then the user's cache."""
    if not beside:
        out = []
    elif storage.is_remote(f.path):
        out = [(storage.join(storage.dirname(f.path), ANALYSIS_DIR, storage.basename(f.path) + suffix), f.name)]
    else:
        folder = os.path.join(os.path.dirname(f.path), ANALYSIS_DIR)
        # a link in its place may lead anywhere: entries are neither read nor written through it
        out = [] if os.path.islink(folder) else [(os.path.join(folder, f.name + suffix), f.name)]
    user = user_cache_dir()
    if user:
        digest = hashlib.blake2b(f.path.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
        out.append((os.path.join(user, "analyses", digest + suffix), f.path))
    return out


def user_cache_dir() -> str | None:
    """The per-user cache directory of the platform (or ``PHASEPROF_CACHE`` when it names one)."""
    chosen = os.environ.get("PHASEPROF_CACHE", "")
    if chosen and enabled():
        return os.path.abspath(os.path.expanduser(chosen))
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return os.path.join(base, "phaseprof", "Cache") if base else None
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Caches/phaseprof")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "phaseprof") if os.path.isabs(base) else None


def unchanged(f: TraceFile) -> bool:
    """Whether the trace is still the one described by ``f`` (same size and modification time)."""
    if storage.is_remote(f.path):
        now = storage.info(f.path)
        return now is not None and (now.size, now.mtime_ns) == (f.size, f.mtime_ns)
    try:
        st = os.stat(f.path)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns) == (f.size, f.mtime_ns)


_version: str | None = None


def version() -> str:
    """The analysis version: a digest of the source of the code that reads and analyses traces, of
    the file contract (which names the phases) and of this module (the format of entries)."""
    global _version
    if _version is None:
        here = os.path.dirname(os.path.abspath(__file__))
        sources = [os.path.join(here, folder, name) for folder in ("reading", "analysis")
                   for name in sorted(os.listdir(os.path.join(here, folder))) if name.endswith(".py")]
        sources += [os.path.abspath(contract.__file__), os.path.abspath(__file__)]  # and this entry format
        digest = hashlib.blake2b(digest_size=12)
        for path in sources:
            digest.update(os.path.basename(path).encode())
            with open(path, "rb") as fh:
                digest.update(fh.read())
        _version = digest.hexdigest()
    return _version


# --- encoding ---------------------------------------------------------------------------------------


def enc_hook(obj):
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        if array.dtype.hasobject:
            raise NotImplementedError("object arrays are never cached")
        dtype = array.dtype.str.encode()
        header = struct.pack(f"<B{len(dtype)}sB{array.ndim}q", len(dtype), dtype, array.ndim, *array.shape)
        return msgspec.msgpack.Ext(_ARRAY, header + array.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot cache a {type(obj).__name__}")


def ext_hook(code: int, data: memoryview):
    """An array from its extension bytes: dtype length and text, rank, shape (int64s), raw data."""
    if code != _ARRAY:
        raise ValueError(f"unknown extension {code}")
    n = data[0]
    dtype = np.dtype(bytes(data[1:1 + n]).decode("ascii"))
    ndim = data[1 + n]
    shape = struct.unpack_from(f"<{ndim}q", data, 2 + n)
    if dtype.hasobject:
        raise ValueError("object arrays are never cached")
    return np.frombuffer(data[2 + n + 8 * ndim:], dtype=dtype).reshape(shape).copy()


def dec_hook(kind, obj):
    if kind is np.ndarray and isinstance(obj, np.ndarray):
        return obj
    raise NotImplementedError(f"expected {kind}, got {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_decoder = msgspec.msgpack.Decoder(Entry, ext_hook=ext_hook, dec_hook=dec_hook)


def _checksum(body) -> bytes:
    return hashlib.blake2b(body, digest_size=_CHECKSUM_BYTES).digest()


def _encode(entry: Entry) -> bytes:
    """The magic line, a checksum of the body, the body (msgpack), deflated (`_deflate`)."""
    body = _encoder.encode(entry)
    return _deflate(_MAGIC + _checksum(body) + body)


def _decode(data: bytes) -> Entry:
    """The entry in ``data``; ValueError when it is not one or a byte of it changed since it was written."""
    data = _inflate(data)
    if not data.startswith(_MAGIC):
        raise ValueError("not a phaseprof analysis")
    view = memoryview(data)
    start = len(_MAGIC) + _CHECKSUM_BYTES
    if _checksum(view[start:]) != view[len(_MAGIC):start]:
        raise ValueError("damaged: the checksum does not match")
    return _decoder.decode(view[start:])


def _deflate(entry: bytes) -> bytes:
    # zlib-ng's level 3: ~1 ms, smaller than zlib's level 1
    return _HEAD + zlib.compress(entry, 3)


def _stored_format(data: bytes) -> tuple[str, int]:
    """The format an entry's first line names and where its compressed body starts; ValueError when
    it is not an entry."""
    if data.startswith(_UNVERSIONED):
        return "1.0", len(_UNVERSIONED)
    end = data.find(b"\n", 0, _MAX_LINE)
    if not data.startswith(_STORED) or end < 0:
        raise ValueError("not a phaseprof analysis")
    return data[len(_STORED):end].decode("ascii", "replace"), end + 1


def _inflate(data: bytes) -> bytes:
    """An entry from its stored bytes, never past `_MAX_ENTRY_BYTES` (a forged one could inflate to
    gigabytes); `formats.OtherFormat` when it is of a major version this phaseprof does not read."""
    found, start = _stored_format(data)
    formats.check(found, MAJOR)
    unzip = zlib.decompressobj()
    out = unzip.decompress(memoryview(data)[start:], _MAX_ENTRY_BYTES)
    if unzip.unconsumed_tail or not unzip.eof:
        raise ValueError("damaged, or larger than an entry can be")
    return out
