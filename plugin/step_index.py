"""The step index of a trace: every step's trace cut kept beside the analysis, so that any step opens
without decoding its trace again.

Cutting a step out of its trace (`analysis.step_trace`) needs the whole file decoded, nested and
partitioned: seconds for a large trace, for every step asked. The trace is decoded once anyway when
it is first analysed (`spans.analyze_file`), so the columns of every step (`StepCut`) are written
then, beside the analysis entry: ``<run>/.phaseprof/<trace file name>.steps`` (or in the user's cache
directory, as the analysis; `cache.places`). TensorBoard's loaders leave it out of a small trace while
other files wait for them; it is written when a step is first cut from that trace
(`serving.store.cut_step`). A step's columns lie in one range of that file, found
through the file's table of steps; serving a step reads its range alone and draws the document from
it (`step_trace.document`, which the full read uses too: the same document, event for event).

The file: a line naming it and its format (``phaseprof-step-index 1.0``, `FORMAT`), a checksum
(BLAKE2b) and the length of the header, the header (msgpack: the key of the trace it was made from,
as the analysis cache's; the tables of names, shapes, threads and phases; per step its number and
the offset, length and checksum of its range), then each step's columns (msgpack, deflated). An
index whose key differs from the trace as it is now, whose header or range does not match its
checksum, or whose columns do not hold together is not used: the step is cut from the trace, and
the index written again. Never a wrong trace, at worst a slow one.

The format follows `phaseprof.formats`: fields a newer minor version added are ignored; an index of
another major version is not used (the step is cut from the trace) and the log says so in one line
per major version. An index whose line says ``1`` (written before formats had a minor version) is
1.0.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct

import msgspec
import numpy as np
from zlib_ng import zlib_ng as zlib

from phaseprof import formats
from phaseprof.contract import OUT_OF_STEP

from . import cache
from .analysis.step_trace import APART, NO_LABEL, StepCut, StepCutter, StepTables, document
from .reading import storage
from .reading.discovery import TraceFile
from .reading.events import RUNTIME
from .reading.file_bytes import not_regular

logger = logging.getLogger(__name__)

SUFFIX = ".steps"
#: The format of the indexes this phaseprof writes, "major.minor" (`phaseprof.formats`).
FORMAT = "1.0"
MAJOR = 1
_MAGIC = b"phaseprof-step-index "
_HEAD = _MAGIC + FORMAT.encode() + b"\n"
#: The longest first line read (a forged index may have none).
_MAX_LINE = 64
_CHECKSUM_BYTES = 16
#: Limits on what is read of an index (a forged one could claim or inflate to anything).
_MAX_HEADER_BYTES = 64 << 20
_MAX_STEP_BYTES = 512 << 20


class Unusable(Exception):
    """There is no index of the trace as it is now (none, stale, damaged): cut the step from the trace."""


class StepRange(msgspec.Struct, array_like=True):
    number: int
    offset: int  # from the end of the header
    length: int
    checksum: bytes


class Header(msgspec.Struct):
    key: cache.Key
    tables: StepTables
    steps: list[StepRange]


_encoder = msgspec.msgpack.Encoder(enc_hook=cache.enc_hook)
_header_decoder = msgspec.msgpack.Decoder(Header)
_cut_decoder = msgspec.msgpack.Decoder(StepCut, ext_hook=cache.ext_hook, dec_hook=cache.dec_hook)


def _checksum(data) -> bytes:
    return hashlib.blake2b(data, digest_size=_CHECKSUM_BYTES).digest()


def encode(key: cache.Key, cutter: StepCutter) -> bytes:
    """The index of every step ``cutter`` holds, for the trace ``key`` names."""
    blobs, steps, offset = [], [], 0
    for i, step in enumerate(cutter.part.steps):
        blob = zlib.compress(_encoder.encode(cutter.cut(i)), 2)  # zlib-ng: twice zlib's level 1 speed, as small
        steps.append(StepRange(step.number, offset, len(blob), _checksum(blob)))
        blobs.append(blob)
        offset += len(blob)
    header = _encoder.encode(Header(key=key, tables=cutter.tables, steps=steps))
    return b"".join([_HEAD, _checksum(header), struct.pack("<Q", len(header)), header, *blobs])


def store(f: TraceFile, cutter: StepCutter, beside: bool = True) -> str | None:
    """Write the index of ``f`` from its decoded trace: beside the run when writable and ``beside``
    (`cache.places`), else in the user's cache directory. Returns where, or None; never raises (no
    index: steps are cut from the trace)."""
    if not cache.enabled() or not cache.unchanged(f):
        return None  # changed while it was being read: the cuts are of neither version
    for path, key_path in cache.places(f, SUFFIX, beside):
        if storage.is_remote(path):
            continue  # a viewer writes nothing into an object store
        try:
            data = encode(cache.Key(key_path, f.size, f.mtime_ns, cache.version()), cutter)
        except (ValueError, TypeError, OverflowError):
            return None
        if cache.write_whole(path, data):
            return path
    return None


def step_trace(f: TraceFile, number: int) -> bytes | None:
    """Step ``number`` of ``f`` as Chrome-trace JSON from its index (None: the trace has no such step);
    raises `Unusable` when no valid index of the trace as it is now can be read."""
    if not cache.enabled():
        raise Unusable("the cache is off")
    for path, key_path in cache.places(f, SUFFIX):
        if storage.is_remote(path):
            continue
        try:
            found = _read(path, key_path, f, number)
        except formats.OtherFormat as e:
            formats.tell_once(logger, "a step index", path, e)
            continue
        except (OSError, ValueError, msgspec.DecodeError, zlib.error, struct.error, IndexError, KeyError):
            continue
        if found is None:
            return None
        tables, cut = found
        return msgspec.json.encode(document(tables, cut))
    raise Unusable("no valid index")


def _read(path: str, key_path: str, f: TraceFile, number: int) -> tuple[StepTables, StepCut] | None:
    """The tables and the columns of step ``number`` from the index at ``path``; None when the index
    has no such step; ValueError (or another decoding error) when the index cannot be trusted."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not_regular(st.st_mode):
            raise ValueError("not a regular file")
        line = os.pread(fd, _MAX_LINE, 0)
        end = line.find(b"\n")
        if not line.startswith(_MAGIC) or end < 0:
            raise ValueError("not a step index")
        found = line[len(_MAGIC):end].decode("ascii", "replace")
        formats.check("1.0" if found == "1" else found, MAJOR)
        start = end + 1 + _CHECKSUM_BYTES + 8  # the header's: after the line, checksum and length
        prefix = _pread(fd, _CHECKSUM_BYTES + 8, end + 1)
        (size,) = struct.unpack_from("<Q", prefix, _CHECKSUM_BYTES)
        if size > min(_MAX_HEADER_BYTES, st.st_size - start):
            raise ValueError("a header larger than the file")
        header_bytes = _pread(fd, size, start)
        if _checksum(header_bytes) != prefix[:_CHECKSUM_BYTES]:
            raise ValueError("damaged header")
        header = _header_decoder.decode(header_bytes)
        k = header.key
        if (k.path, k.size, k.mtime_ns, k.version) != (key_path, f.size, f.mtime_ns, cache.version()):
            raise ValueError("made from another trace, or by another version")
        if not (storage.is_remote(f.path) or cache.unchanged(f)):
            raise ValueError("the trace changed")
        entry = next((s for s in header.steps if s.number == number), None)
        if entry is None:
            return None
        if not (entry.offset >= 0 and 0 <= entry.length <= _MAX_STEP_BYTES
                and start + size + entry.offset + entry.length <= st.st_size):
            raise ValueError("a step's range lies outside the file")
        blob = _pread(fd, entry.length, start + size + entry.offset)
    finally:
        os.close(fd)
    if _checksum(blob) != entry.checksum:
        raise ValueError("damaged step")
    unzip = zlib.decompressobj()
    raw = unzip.decompress(blob, _MAX_STEP_BYTES)
    if unzip.unconsumed_tail or not unzip.eof:
        raise ValueError("damaged step, or larger than a step can be")
    cut = _cut_decoder.decode(raw)
    if cut.number != number or not holds(header.tables, cut):
        raise ValueError("columns that do not hold together")
    return header.tables, cut


def _pread(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    while len(data) < n:  # a regular file: short reads only near its end
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            raise ValueError("the file ends early")
        data += more
    return data


def holds(tables: StepTables, cut: StepCut) -> bool:
    """Whether a step's columns hold together: columns of numbers of one length per group (host events,
    device work with its launch, phase segments, time kept out) and codes that index the tables they
    name, so that drawing the document cannot fail."""
    fields = cut.__struct_fields__
    groups = [[getattr(cut, k) for k in fields if k.startswith(prefixes)]
              for prefixes in (("host_",), ("dev_", "launch_"), ("seg_",), ("out_",))]
    if any(c.ndim != 1 or c.dtype.kind not in "iuf" or len(c) != len(group[0]) for group in groups for c in group):
        return False
    names, threads, phases = len(tables.names), len(tables.threads), len(tables.phases)
    lowest = APART - (len(OUT_OF_STEP) - 1)

    def within(codes: np.ndarray, lo: int, hi: int) -> bool:
        return codes.dtype.kind in "iu" and (not len(codes) or (int(codes.min()) >= lo and int(codes.max()) < hi))

    return (-1 <= tables.main_thread < threads and bool(tables.shapes)
            and within(cut.host_thread, 0, threads) and within(cut.launch_thread, 0, threads)
            and within(cut.host_name, 0, names) and within(cut.dev_name, 0, names)
            and within(cut.dev_owner, -1, names) and within(cut.host_shapes, 0, len(tables.shapes))
            and within(cut.host_stack, -1, len(cut.stacks))
            and within(cut.host_kind, 0, RUNTIME + 1) and within(cut.dev_kind, 0, 3)
            and within(cut.host_label, lowest, phases) and within(cut.dev_label, lowest, phases)
            and not (cut.dev_label == NO_LABEL).any()
            and within(cut.seg_phase, 0, phases) and within(cut.out_kind, 0, len(OUT_OF_STEP)))
