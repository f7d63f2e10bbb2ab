"""Decode one trace file (Kineto chrome-trace JSON, plain or gzipped) into the columnar `Trace`.

Typed decoding with msgspec reads only the fields the analysis needs and skips the rest at C speed;
the garbage collector is paused meanwhile (it would otherwise rescan the growing heap again and again).
Large files are split at an event boundary and the halves decoded by two processes at once.

Every failure raises `TraceError` with a one-line reason; malformed single events are skipped and
counted on the `Trace` so that one bad event does not hide a whole file.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import gzip
import mmap
import os
import pickle
import re
import threading
import zlib
from collections.abc import Iterator
from operator import attrgetter

import msgspec
import numpy as np
from msgspec import field

from .errors import TraceError
from .events import (
    ANNOTATION,
    KERNEL,
    MEMCPY,
    MEMSET,
    OP,
    RUNTIME,
    DeviceEvents,
    HostEvents,
    MemoryEvents,
    Thread,
    Trace,
    memory_device_label,
)

# --- what is decoded ------------------------------------------------------------------------------

_NAN = float("nan")


class _Args(msgspec.Struct, gc=False, frozen=True):
    # Sentinels instead of None so whole columns convert to numpy arrays in one call.
    correlation: int = -1
    input_dims: msgspec.Raw = field(default=msgspec.Raw(b""), name="Input Dims")
    total_allocated: float = field(default=-1.0, name="Total Allocated")
    nbytes: float = field(default=_NAN, name="Bytes")
    device_type: int = field(default=0, name="Device Type")
    device_id: int = field(default=-1, name="Device Id")
    stream: int = -1
    name: str = ""  # metadata events: process / thread names


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    dur: float = _NAN
    args: _Args = _NO_ARGS


class _DistributedInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None


class _DeviceProperties(msgspec.Struct, gc=False):
    name: str = ""


class _TraceObject(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    distributedInfo: _DistributedInfo | None = None
    deviceProperties: list[_DeviceProperties] | None = None


_OBJECT_DECODER = msgspec.json.Decoder(_TraceObject)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])

_HOST_KINDS = {
    "cpu_op": OP,
    "Operator": OP,
    "": OP,  # legacy `EventList.export_chrome_trace` writes no category
    "user_annotation": ANNOTATION,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "Runtime": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "xpu_runtime": RUNTIME,
    "mtia_runtime": RUNTIME,
}
_DEVICE_KINDS = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "Memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "Memset": MEMSET,
}
#: Event phases of the Chrome trace format; anything else is malformed.
_KNOWN_PHASES = frozenset("BEXiIMCbensftPONDcRSTpF")
_MEMORY = "[memory]"

#: No trace compresses better than this; a trailer claiming more is not trusted.
_MAX_GZIP_RATIO = 200
#: Files larger than this are decoded by two processes (where fork is safe).
PARALLEL_MIN_BYTES = 24 << 20


# --- entry point ----------------------------------------------------------------------------------


def read_trace(path: str, *, parallel: bool = True, shapes: bool = True) -> Trace:
    """Decode ``path`` into a `Trace`; raise `TraceError` if the file cannot be read at all.

    ``shapes=False`` skips the ops' input shapes (a fifth of the decoding work), for reports that
    do not show them."""
    with _open_bytes(path) as buf:
        if not len(buf):
            raise TraceError(path, "empty file")
        start = _first_token(buf)
        if start is None:
            raise TraceError(path, "empty file (only whitespace)")
        if buf[start : start + 1] not in (b"{", b"["):
            raise TraceError(path, "not JSON: a trace starts with '{' or '['")
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            parts = None
            if parallel and len(buf) >= PARALLEL_MIN_BYTES and _fork_is_safe():
                parts = _decode_in_two(buf, start, shapes)
            if parts is None:
                parts = [_decode_part(buf, path, shapes)]
        except msgspec.DecodeError as e:
            raise TraceError(path, f"not valid JSON ({_lower_first(str(e))})") from None
        except msgspec.ValidationError as e:
            raise TraceError(path, f"unexpected trace layout: {e}") from None
        finally:
            if gc_was_enabled:
                gc.enable()
    return _merge(path, parts)


@contextlib.contextmanager
def _open_bytes(path: str) -> Iterator[bytearray | mmap.mmap]:
    """The file's decompressed bytes, writable in this process only (the two-process split edits
    a few bytes in place). Plain files are memory-mapped copy-on-write: nothing is copied."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                try:
                    data = _gunzip(fh.read())
                except (OSError, EOFError, zlib.error) as e:
                    raise TraceError(path, f"corrupt gzip data ({e})") from None
                yield data
                return
            if os.fstat(fh.fileno()).st_size == 0:
                yield bytearray()
                return
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
                yield mm
    except TraceError:
        raise
    except OSError as e:
        raise TraceError(path, f"cannot read file ({e.strerror or e})") from None


def _gunzip(data: bytes) -> bytearray:
    """Decompress gzip ``data`` straight into one writable buffer, sized from the gzip trailer
    (one copy of the output instead of two; multi-member or odd files take the general path)."""
    size = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    if size > _MAX_GZIP_RATIO * len(data):  # a truncated file's "trailer" is arbitrary bytes
        return bytearray(gzip.decompress(data))
    out = bytearray(size)
    view = memoryview(out)
    inflate = zlib.decompressobj(wbits=31)
    pos = 0
    for start in range(0, len(data), 1 << 20):
        piece = inflate.decompress(data[start : start + (1 << 20)])
        if pos + len(piece) > size:
            view.release()
            return bytearray(gzip.decompress(data))
        view[pos : pos + len(piece)] = piece
        pos += len(piece)
    piece = inflate.flush()
    if not inflate.eof or inflate.unused_data or pos + len(piece) != size:
        view.release()
        return bytearray(gzip.decompress(data))  # several members, or a trailer that lies
    view[pos:] = piece
    view.release()
    return out


_NON_SPACE = re.compile(rb"\S")


def _first_token(buf) -> int | None:
    m = _NON_SPACE.search(buf, 0, min(len(buf), 1 << 16))
    return m.start() if m else None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# --- decoding a part ------------------------------------------------------------------------------


class _Part:
    """Columns decoded from one part of a file, with the part's own string tables."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.shapes: dict[bytes, int] = {b"": 0}
        self.threads: dict[tuple, int] = {}
        self.thread_labels: dict[tuple, str] = {}
        self.memory_devices: dict[tuple[int, int], int] = {}
        self.rank: int | None = None
        self.world_size: int | None = None
        self.gpu_names: list[str] = []
        self.skipped = 0
        self.first_problem = ""
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, np.ndarray] = {}
        self.memory: dict[str, np.ndarray] = {}


def _decode_part(data, path: str, shapes: bool = True) -> _Part:
    """Decode ``data`` (a whole file, or one half of it made whole) into columns."""
    part = _Part()
    first = _first_token(data) or 0
    if data[first : first + 1] == b"[":
        events = _LIST_DECODER.decode(data)
    else:
        obj = _OBJECT_DECODER.decode(data)
        if obj.traceEvents is None:
            raise TraceError(path, "a JSON object without a 'traceEvents' list")
        events = obj.traceEvents
        if obj.distributedInfo is not None:
            part.rank = obj.distributedInfo.rank
            part.world_size = obj.distributedInfo.world_size
        if obj.deviceProperties:
            part.gpu_names = [d.name for d in obj.deviceProperties]
    _fill_columns(part, events, shapes)
    return part


_CAT = attrgetter("cat")
_PH = attrgetter("ph")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_NAME = attrgetter("name")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_CORRELATION = attrgetter("args.correlation")
_INPUT_DIMS = attrgetter("args.input_dims")
_NBYTES = attrgetter("args.nbytes")
_TOTAL = attrgetter("args.total_allocated")
_DEVICE_TYPE = attrgetter("args.device_type")
_DEVICE_ID = attrgetter("args.device_id")
_STREAM = attrgetter("args.stream")
#: Categories that may hold `[memory]` events (today's, the legacy export's, and none in 2021).
_INSTANT_CATEGORIES = frozenset({"cpu_instant_event", ""})


def _fill_columns(part: _Part, events: list[_Event], shapes: bool = True) -> None:
    """Sort the decoded events into host, device and memory columns.

    One Python loop groups events by category; every column is then pulled out of a group by
    C-level iteration (``map`` + ``attrgetter`` into ``np.fromiter``), several times cheaper than
    appending field by field in a loop over hundreds of thousands of events.
    """
    groups: dict[str, list[_Event]] = {}
    get = groups.get
    for e in events:
        group = get(e.cat)
        if group is None:
            group = groups[e.cat] = []
        group.append(e)

    problems = _Problems(events)
    host: list[dict[str, np.ndarray]] = []
    device: list[dict[str, np.ndarray]] = []
    memory: list[_Event] = []
    for cat, group in groups.items():
        phases = set(map(_PH, group))
        if not phases <= _KNOWN_PHASES:
            bad = phases - _KNOWN_PHASES
            problems.add([e for e in group if e.ph in bad], "has an unknown phase type 'ph'")
            group = [e for e in group if e.ph not in bad]
        if "M" in phases:
            for e in group:
                if e.ph == "M" and e.name == "thread_name" and e.args.name:
                    part.thread_labels[(e.pid, _thread_id(e.tid))] = e.args.name
        if cat in _INSTANT_CATEGORIES:
            memory.extend(e for e in group if e.name == _MEMORY and e.ph in "XiI")
        if cat in _HOST_KINDS or cat in _DEVICE_KINDS:
            if phases != {"X"}:
                group = [e for e in group if e.ph == "X" and e.name != _MEMORY]
            if cat == "":  # no category: legacy export's operators, or stray span markers
                group = [e for e in group if not isinstance(e.pid, str) or e.pid == "CPU functions"]
            group, ts, dur = _valid_complete(group, problems)
            if group:
                if cat in _HOST_KINDS:
                    host.append(_host_columns(group, ts, dur, _HOST_KINDS[cat], part, shapes))
                else:
                    device.append(_device_columns(group, ts, dur, _DEVICE_KINDS[cat], part))
    part.host = _concat(host, _HOST_COLUMNS)
    part.device = _concat(device, _DEVICE_COLUMNS)
    part.memory = _memory_columns(memory, part, problems)
    part.skipped = problems.count
    part.first_problem = problems.first


def _valid_complete(group: list[_Event], problems: _Problems) -> tuple[list[_Event], np.ndarray, np.ndarray]:
    """The group without complete events that lack a start or a duration or have a negative one,
    with its start and duration columns."""
    ts = np.fromiter(map(_TS, group), np.float64, len(group))
    dur = np.fromiter(map(_DUR, group), np.float64, len(group))
    bad = np.isnan(ts) | np.isnan(dur) | (dur < 0)
    if not bad.any():
        return group, ts, dur
    indices = np.flatnonzero(bad)
    first = int(indices[0])
    what = (
        "has no 'ts'"
        if np.isnan(ts[first])
        else "has no 'dur'" if np.isnan(dur[first]) else f"has a negative duration ({dur[first]:g})"
    )
    problems.add([group[i] for i in indices.tolist()], what)
    keep = ~bad
    return [e for e, k in zip(group, keep.tolist()) if k], ts[keep], dur[keep]


_HOST_COLUMNS = {"ts": np.float64, "dur": np.float64, "thread": np.int32, "name": np.int32,
                 "kind": np.int8, "corr": np.int64, "shapes": np.int32}
_DEVICE_COLUMNS = {"ts": np.float64, "dur": np.float64, "device": np.int32, "stream": np.int32,
                   "name": np.int32, "kind": np.int8, "corr": np.int64}


def _host_columns(group: list[_Event], ts, dur, kind: int, part: _Part, shapes: bool) -> dict[str, np.ndarray]:
    n = len(group)
    return {
        "ts": ts,
        "dur": dur,
        "thread": _thread_codes(group, part.threads),
        "name": _codes(list(map(_NAME, group)), part.names),
        "kind": np.full(n, kind, np.int8),
        "corr": np.fromiter(map(_CORRELATION, group), np.int64, n) if kind == RUNTIME else np.full(n, -1, np.int64),
        "shapes": (_codes(list(map(bytes, map(_INPUT_DIMS, group))), part.shapes) if kind == OP and shapes
                   else np.zeros(n, np.int32)),
    }


def _device_columns(group: list[_Event], ts, dur, kind: int, part: _Part) -> dict[str, np.ndarray]:
    n = len(group)
    stream = np.fromiter(map(_STREAM, group), np.int64, n)
    for i in np.flatnonzero(stream < 0).tolist():  # no "stream" arg: the tid is the stream
        tid = group[i].tid
        digits = str(tid) if isinstance(tid, int) else "".join(c for c in tid if c.isdigit())  # 2021: "stream 7"
        stream[i] = int(digits) if digits else 0
    return {
        "ts": ts,
        "dur": dur,
        "device": np.fromiter((p if isinstance(p, int) else 0 for p in map(_PID, group)), np.int32, n),
        "stream": stream.astype(np.int32),
        "name": _codes(list(map(_NAME, group)), part.names),
        "kind": np.full(n, kind, np.int8),
        "corr": np.fromiter(map(_CORRELATION, group), np.int64, n),
    }


def _memory_columns(events: list[_Event], part: _Part, problems: _Problems) -> dict[str, np.ndarray]:
    n = len(events)
    ts = np.fromiter(map(_TS, events), np.float64, n)
    nbytes = np.fromiter(map(_NBYTES, events), np.float64, n)
    bad = np.isnan(ts) | np.isnan(nbytes)
    if bad.any():
        problems.add([events[i] for i in np.flatnonzero(bad).tolist()], "([memory]) has no 'ts' or no 'Bytes'")
        keep = ~bad
        events = [e for e, k in zip(events, keep.tolist()) if k]
        ts, nbytes, n = ts[keep], nbytes[keep], int(keep.sum())
    device_type = np.fromiter(map(_DEVICE_TYPE, events), np.int64, n)
    device_id = np.fromiter(map(_DEVICE_ID, events), np.int64, n)
    keys, codes = np.unique(device_type * 65536 + device_id + 1, return_inverse=True)
    local = np.array(
        [part.memory_devices.setdefault((int(k) // 65536, int(k) % 65536 - 1), len(part.memory_devices)) for k in keys],
        dtype=np.int32,
    )
    return {
        "ts": ts,
        "nbytes": nbytes.astype(np.int64),
        "total": np.fromiter(map(_TOTAL, events), np.float64, n).astype(np.int64),
        "device": local[codes] if n else np.empty(0, np.int32),
    }


def _concat(groups: list[dict[str, np.ndarray]], columns: dict[str, type]) -> dict[str, np.ndarray]:
    if not groups:
        return {k: np.empty(0, dtype) for k, dtype in columns.items()}
    if len(groups) == 1:
        return groups[0]
    return {k: np.concatenate([g[k] for g in groups]) for k in columns}


class _Problems:
    """Counts malformed events and describes the first one (with its index in the file)."""

    def __init__(self, events: list[_Event]):
        self._events = events
        self.count = 0
        self.first = ""

    def add(self, bad: list[_Event], what: str) -> None:
        if not bad:
            return
        self.count += len(bad)
        if not self.first:
            e = bad[0]
            index = next((i for i, x in enumerate(self._events) if x is e), -1)
            label = f"{e.ph} '{e.name}'" if e.name else repr(e.ph)
            self.first = f"event {index} ({label}) {what}"


def _codes(values: list, table: dict) -> np.ndarray:
    """Code each value as its index in ``table`` (extended with values not seen before)."""
    for v in set(values) - table.keys():
        table[v] = len(table)
    return np.fromiter(map(table.__getitem__, values), np.int32, len(values))


def _thread_id(tid: int | str) -> int | str:
    return int(tid) if isinstance(tid, str) and tid.isdigit() else tid  # 2021 writes "25738"


def _thread_codes(events: list[_Event], table: dict) -> np.ndarray:
    try:  # the common case: numeric ids, often a single thread
        pids = np.fromiter(map(_PID, events), np.int64, len(events))
        tids = np.fromiter(map(_TID, events), np.int64, len(events))
    except (TypeError, ValueError):
        keys = list(zip(map(_PID, events), map(_TID, events)))
        local = {key: table.setdefault((key[0], _thread_id(key[1])), len(table)) for key in set(keys)}
        return np.fromiter(map(local.__getitem__, keys), np.int32, len(keys))
    if (pids == pids[0]).all() and (tids == tids[0]).all():
        return np.full(len(events), table.setdefault((int(pids[0]), int(tids[0])), len(table)), np.int32)
    pairs = np.stack([pids, tids], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    local = np.array([table.setdefault((int(p), int(t)), len(table)) for p, t in unique], dtype=np.int32)
    return local[inverse.ravel()]


# --- two processes for large files ----------------------------------------------------------------

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _fork_is_safe() -> bool:
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
    """The offset that splits the decoding work in two halves.

    The work grows with the number of events more than with bytes, and events are not the same
    size along a file (memory events, at the end of today's traces, are half the size of ops), so
    events are counted in a few small windows spread over the file and the split put where half of
    the estimated events lie before it."""
    size = len(buf) - start
    step = size // samples
    if step < window:
        return start + size // 2
    counts = [bytes(buf[start + i * step : start + i * step + window]).count(b'"ph"') + 1 for i in range(samples)]
    half, seen = sum(counts) / 2, 0.0
    for i, c in enumerate(counts):
        if seen + c >= half:
            return start + int((i + (half - seen) / c) * step)
        seen += c
    return start + size // 2


def _decode_in_two(buf, start: int, shapes: bool) -> list[_Part] | None:
    """Decode the two halves of ``buf`` in this process and a forked child; None to fall back.

    The split is at a ``},{`` between two events near the middle of the work (`_halfway`). Each
    process rewrites a few bytes of its own copy-on-write copy so its half is a whole JSON document
    again: the first half ends ``}]}``, the second starts ``{"traceEvents":[{``. A split that did not
    land between two events then fails to decode, and the caller decodes the file in one process.
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
            part = _decode_part(memoryview(buf)[brace - len(tail_open) :], "", shapes)
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
        first = _decode_part(memoryview(buf)[: brace + 1], "", shapes)
        failed = False
    except (msgspec.DecodeError, msgspec.ValidationError, TraceError):
        failed = True
    finally:
        buf[comma : brace + 1] = saved
    with os.fdopen(read_fd, "rb") as inp:
        payload = inp.read()
    if failed or not payload:
        os.waitpid(pid, 0)
        return None
    second: _Part = pickle.loads(payload)
    _exited.append(pid)  # tearing down its memory takes the child a while: reaped later
    if first.rank is None:
        first.rank, first.world_size = second.rank, second.world_size
    first.gpu_names = first.gpu_names or second.gpu_names
    return [first, second]


# --- merging parts into one Trace -----------------------------------------------------------------


def _remap(codes: np.ndarray, table: dict, into: dict) -> np.ndarray:
    """Re-code ``codes`` (indices into ``table``'s order) as indices into ``into``, extending it."""
    mapping = np.empty(max(len(table), 1), dtype=np.int32)
    for key, code in table.items():
        new = into.get(key)
        if new is None:
            new = into[key] = len(into)
        mapping[code] = new
    return mapping[codes] if len(codes) else codes


def _merge(path: str, parts: list[_Part]) -> Trace:
    base = parts[0]
    for other in parts[1:]:
        other.host["name"] = _remap(other.host["name"], other.names, base.names)
        other.device["name"] = _remap(other.device["name"], other.names, base.names)
        other.host["shapes"] = _remap(other.host["shapes"], other.shapes, base.shapes)
        other.host["thread"] = _remap(other.host["thread"], other.threads, base.threads)
        other.memory["device"] = _remap(other.memory["device"], other.memory_devices, base.memory_devices)
        base.thread_labels.update(other.thread_labels)
        base.skipped += other.skipped
        base.first_problem = base.first_problem or other.first_problem

    def columns(attr: str) -> dict[str, np.ndarray]:
        if len(parts) == 1:
            return getattr(base, attr)
        return {k: np.concatenate([getattr(p, attr)[k] for p in parts]) for k in getattr(base, attr)}

    threads = [None] * len(base.threads)
    for (pid, tid), code in base.threads.items():
        label = base.thread_labels.get((pid, tid)) or f"thread {tid}"
        threads[code] = Thread(pid=pid, tid=tid, label=label)
    devices = [""] * len(base.memory_devices)
    for (dtype, did), code in base.memory_devices.items():
        devices[code] = memory_device_label(dtype, did)
    names = [""] * len(base.names)
    for name, code in base.names.items():
        names[code] = name
    shapes = [""] * len(base.shapes)
    for raw, code in base.shapes.items():
        shapes[code] = raw.decode("utf-8", "replace")
    problem = base.first_problem
    return Trace(
        path=path,
        host=HostEvents(**columns("host")),
        device=DeviceEvents(**columns("device")),
        memory=MemoryEvents(**columns("memory")),
        names=names,
        shapes=shapes,
        threads=threads,
        memory_devices=devices,
        rank=base.rank,
        world_size=base.world_size,
        gpu_names=base.gpu_names,
        skipped=base.skipped,
        first_problem=problem,
    )
