"""Decode one trace file (Kineto chrome-trace JSON, plain or gzipped) into the columnar `Trace`.

Typed decoding with msgspec reads only the fields the analysis needs and skips the rest at C speed;
the garbage collector is paused meanwhile (it would otherwise rescan the growing heap again and again).
Large files are split and the halves decoded by two processes at once (`split`).

Two speeds, one result. A well-formed file is decoded in one typed pass. When a value of the wrong
type stops that pass (``"dur": "5"``, ``"pid": 1.5``, an event that is not an object), the same
file is decoded again event by event: a field that cannot be read is dropped from its event, or
the event is skipped, and either is counted on the `Trace` (``"3 events skipped: dur is not a
number"``) so that one bad event never hides a whole file. Values that decode but cannot be held
(integers past 64 bits, non-finite times) are caught column by column the same way.

Every failure of the file as a whole raises `TraceError` with a one-line reason.
"""

from __future__ import annotations

import gc
import re
import sys
import threading
import time

import msgspec
import numpy as np

from . import split
from .columns import Part, fill_columns
from .events import PYTHON, DeviceEvents, HostEvents, MemoryEvents, Thread, Trace, memory_device_label
from .file_bytes import Limits, TraceError, trace_bytes
from .lenient import capability, decode_leniently, small_int, usable_cpus
from .trace_fields import LIST_DECODER, OBJECT_DECODER, Event

__all__ = ["TraceError", "read_trace", "Limits"]

#: Nesting deeper than this is refused (decoding recurses once per level).
MAX_DEPTH = 100_000


# --- entry point ----------------------------------------------------------------------------------


def read_trace(path: str, *, parallel: bool = True, shapes: bool = True, limits: Limits | None = None) -> Trace:
    """Decode ``path`` into a `Trace`; raise `TraceError` if the file cannot be read at all.

    ``shapes=False`` skips the ops' input shapes (a fifth of the decoding work), for reports that
    do not show them. ``limits``: size and time budgets (default: `Limits.from_env()`)."""
    limits = limits or Limits.from_env()
    deadline = time.monotonic() + limits.max_seconds
    with trace_bytes(path, limits, deadline) as buf:
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
            if parallel and len(buf) >= split.PARALLEL_MIN_BYTES and split.fork_is_safe():
                parts = split.decode_in_two(buf, start, lambda half, kept=None: _decode_part(
                    half, path, shapes, deadline, kept))
            if parts is None:
                parts = [_decode_part(buf, path, shapes, deadline)]
        finally:
            if gc_was_enabled:
                gc.enable()
    return _merge(path, parts)


_NON_SPACE = re.compile(rb"\S")


def _first_token(buf) -> int | None:
    m = _NON_SPACE.search(buf, 0, min(len(buf), 1 << 16))
    return m.start() if m else None


def _json_problem(e: msgspec.DecodeError) -> str:
    """msgspec's message in plain words: ``not valid JSON (invalid character (byte 12))``."""
    text = str(e).removeprefix("JSON is malformed: ")
    if text.startswith("Input data was truncated"):
        text = "the file ends in the middle of the JSON (truncated?)"
    elif text[1:2].islower():
        text = text[:1].lower() + text[1:]
    return f"not valid JSON ({text})"


#: A \uD800-\uDFFF escape: half of a UTF-16 pair, valid only as a high half followed by a low one.
_SURROGATE_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a pair: kept
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"  # half of one: replaced
)


def _replace_lone_surrogates(data) -> bytes:
    """``data`` with every unpaired surrogate escape replaced by ``\\ufffd`` (JSON writers that
    cut UTF-16 strings leave them; they are not text, and the decoder refuses them)."""
    return _SURROGATE_ESCAPE.sub(lambda m: m.group() if len(m.group()) == 12 else rb"\ufffd", bytes(data))


def _decode_part(data, path: str, shapes: bool, deadline: float, kept: list | None = None) -> Part:
    """Decode ``data`` (a whole file, or one half of it made whole) into columns. ``kept``: where
    the decoded events are left instead of freed, for a process about to exit (freeing a few
    hundred thousand of them costs a tenth of decoding them)."""
    try:
        try:
            part, events, positions = _decode_events(data, path, deadline)
        except msgspec.DecodeError as e:
            if "surrogate" not in str(e):
                raise
            part, events, positions = _decode_events(_replace_lone_surrogates(data), path, deadline)
            part.problems.degrade(-1, "", "text with unpaired UTF-16 surrogates (replaced by \ufffd)")
    except RecursionError:
        part, events, positions = _deeply_nested(data, path, deadline)
    except msgspec.DecodeError as e:
        raise TraceError(path, _json_problem(e)) from None
    if time.monotonic() > deadline:
        raise TraceError(path, "took too long to read (see PHASEPROF_MAX_READ_SECONDS)")
    fill_columns(part, events, positions, shapes)
    if kept is not None:
        kept.append(events)
    return part


def _deeply_nested(data, path: str, deadline: float):
    """Decode JSON nested deeper than the interpreter's recursion limit allows (an arg holding a
    thousand nested lists), on a thread with a stack deep enough for `MAX_DEPTH` levels."""
    result: list = []

    def run() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(MAX_DEPTH + 1000)
        try:
            result.append(_decode_events(data, path, deadline))
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            result.append(e)
        finally:
            sys.setrecursionlimit(old)

    size = threading.stack_size()
    threading.stack_size(512 << 20)
    try:
        worker = threading.Thread(target=run, name="phaseprof-deep-decode")
        worker.start()
    finally:
        threading.stack_size(size)
    worker.join()
    (outcome,) = result
    if isinstance(outcome, RecursionError):
        raise TraceError(path, f"JSON nested more than {MAX_DEPTH:,} levels deep")
    if isinstance(outcome, msgspec.DecodeError):
        raise TraceError(path, _json_problem(outcome))
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _decode_events(data, path: str, deadline: float) -> tuple[Part, list[Event], list[int] | None]:
    """The part's file-level facts and its events: typed in one pass when the file is well formed,
    else event by event (``positions``: each kept event's index in the file, None when all kept)."""
    part = Part()
    bare_list = data[_first_token(data) or 0 : (_first_token(data) or 0) + 1] == b"["
    try:
        if bare_list:
            return part, LIST_DECODER.decode(data), None
        obj = OBJECT_DECODER.decode(data)
    except msgspec.ValidationError:
        return decode_leniently(data, path, part, bare_list, deadline)
    if obj.traceEvents is None:
        raise TraceError(path, "a JSON object without a 'traceEvents' list")
    if obj.distributedInfo is not None:
        part.rank = small_int(obj.distributedInfo.rank)
        part.world_size = small_int(obj.distributedInfo.world_size)
    if obj.deviceProperties:
        part.gpu_names = [d.name for d in obj.deviceProperties]
        part.gpu_capabilities = [capability(d.computeMajor, d.computeMinor) for d in obj.deviceProperties]
    if isinstance(obj.cpus, dict):
        part.cpus = usable_cpus(obj.cpus.get("usable"), obj.cpus.get("count"))
    return part, obj.traceEvents, None


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


def _merge(path: str, parts: list[Part]) -> Trace:
    base = parts[0]
    for other in parts[1:]:
        other.host["name"] = _remap(other.host["name"], other.names, base.names)
        other.device["name"] = _remap(other.device["name"], other.names, base.names)
        other.host["shapes"] = _remap(other.host["shapes"], other.shapes, base.shapes)
        other.host["comm"] = _remap(other.host["comm"], other.comms, base.comms)
        other.memory["thread"] = _remap(other.memory["thread"], other.threads, base.threads)
        other.host["thread"] = _remap(other.host["thread"], other.threads, base.threads)
        other.memory["device"] = _remap(other.memory["device"], other.memory_devices, base.memory_devices)
        base.thread_labels.update(other.thread_labels)
        base.problems.merge(other.problems)
        if base.rank is None:
            base.rank, base.world_size = other.rank, other.world_size
        if not base.gpu_names:
            base.gpu_names, base.gpu_capabilities = other.gpu_names, other.gpu_capabilities
        base.cpus = base.cpus or other.cpus

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
    comms = [None] * len(base.comms)
    for args, code in base.comms.items():
        comms[code] = args
    shapes = [""] * len(base.shapes)
    for raw, code in base.shapes.items():
        shapes[code] = raw.decode("utf-8", "replace")
    host = HostEvents(**columns("host"))
    python = host.kind == PYTHON
    return Trace(
        path=path,
        host=host.take(~python) if python.any() else host,
        python=host.take(python),
        device=DeviceEvents(**columns("device")),
        memory=MemoryEvents(**columns("memory")),
        names=names,
        shapes=shapes,
        threads=threads,
        memory_devices=devices,
        comms=comms,
        rank=base.rank,
        world_size=base.world_size,
        gpu_names=base.gpu_names,
        gpu_capabilities=base.gpu_capabilities,
        cpus=base.cpus,
        skipped=base.problems.count,
        first_problem=base.problems.describe(),
    )
