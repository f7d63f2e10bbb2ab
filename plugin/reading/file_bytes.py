"""The bytes of one trace file, read within limits: regular files only, bounded size and time.

A logdir is written by others and may hold anything: a FIFO named like a trace (``open()`` would
wait forever for a writer), a device file, a gzip bomb (1 MB inflating to gigabytes), a file that
is still growing. Files are opened non-blocking and checked with ``fstat`` before a byte is read;
gzip is inflated in pieces and stopped at a budget; reading stops at a deadline. Every refusal is
a `TraceError` whose reason says what was wrong in plain words.

The limits can be changed through the environment (see `Limits`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import time
from collections.abc import Iterator

import msgspec
from zlib_ng import zlib_ng as zlib

from . import storage
from .errors import TraceError

_GIB = 1 << 30
_MIB = 1 << 20
_PIECE = 1 << 20  # bytes of compressed input, and at most of output, per inflate call
_BOM = b"\xef\xbb\xbf"


class Limits(msgspec.Struct, frozen=True):
    """How much one trace file may cost to read.

    ``max_bytes``: the most bytes a file may hold once decompressed (``PHASEPROF_MAX_TRACE_BYTES``);
    ``max_ratio``: a gzip file may inflate to at most this many times its own size, or to
    ``min_budget`` if that is more (``PHASEPROF_MAX_INFLATE_RATIO``; real traces compress 5-30x);
    ``max_seconds``: the time reading and decoding one file may take (``PHASEPROF_MAX_READ_SECONDS``).
    """

    max_bytes: int = 4 * _GIB
    max_ratio: int = 100
    min_budget: int = 64 * _MIB
    max_seconds: float = 300.0

    @classmethod
    def from_env(cls) -> Limits:
        env = os.environ
        default = cls()
        return cls(
            max_bytes=_env_number(env, "PHASEPROF_MAX_TRACE_BYTES", default.max_bytes, int),
            max_ratio=_env_number(env, "PHASEPROF_MAX_INFLATE_RATIO", default.max_ratio, int),
            max_seconds=_env_number(env, "PHASEPROF_MAX_READ_SECONDS", default.max_seconds, float),
        )

    def inflate_budget(self, compressed: int) -> int:
        return min(self.max_bytes, max(self.min_budget, self.max_ratio * compressed))


def _env_number(env, key: str, default, kind):
    try:
        value = kind(env[key])
    except (KeyError, ValueError):
        return default
    return value if value > 0 else default


def size_text(n: float) -> str:
    """4 GiB, 64 MiB, 12 KiB, 10 B."""
    for unit, scale in (("GiB", _GIB), ("MiB", _MIB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{int(n)} B"


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(mode: int) -> str | None:
    """What a file of this mode is, if not a regular file ("a FIFO", …); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "a special file")


@contextlib.contextmanager
def trace_bytes(path: str, limits: Limits, deadline: float) -> Iterator[bytearray | mmap.mmap]:
    """The file's decompressed bytes, writable in this process only (the two-process split edits a
    few bytes in place; a UTF-8 byte-order mark is blanked). Plain files are memory-mapped
    copy-on-write: nothing is copied. A URL (`storage`) is downloaded whole, within the same limits."""
    if storage.is_remote(path):
        data = storage.read(path, limits.max_bytes)
        if data[:2] == b"\x1f\x8b":
            data = inflate(data, limits.inflate_budget(len(data)), path, deadline)
        buf = data if isinstance(data, bytearray) else bytearray(data)
        _blank_bom(buf)
        yield buf
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TraceError(path, f"cannot open the file ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        what = not_regular(st.st_mode)
        if what:
            raise TraceError(path, f"not a regular file ({what}); only regular files are read")
        if st.st_size > limits.max_bytes:
            raise TraceError(path, f"the file is larger than {size_text(limits.max_bytes)} "
                                   "(set PHASEPROF_MAX_TRACE_BYTES to read it)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            head = fh.read(2)
        if head == b"\x1f\x8b":
            data = _read_all(fd, limits.max_bytes, path)
            buf = inflate(data, limits.inflate_budget(len(data)), path, deadline)
            del data
            _blank_bom(buf)
            yield buf
            return
        if st.st_size == 0:
            yield bytearray()
            return
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        try:
            _blank_bom(mm)
            yield mm
        finally:
            with contextlib.suppress(BufferError):  # a view of it still lives (in a traceback on its
                mm.close()  # way up): the mapping is freed with that
    except OSError as e:
        raise TraceError(path, f"cannot read the file ({e.strerror or e})") from None
    finally:
        os.close(fd)


def read_regular(path: str, limit: int, *, follow_links: bool = True) -> bytes:
    """The whole of ``path`` if it is a regular file of at most ``limit`` bytes (opened non-blocking:
    a FIFO never blocks); `TraceError` otherwise. For small files beside the traces (cached analyses).
    ``follow_links=False``: a symbolic link at ``path`` is refused, not followed. A URL (`storage`) is
    read from its store."""
    if storage.is_remote(path):
        return storage.read(path, limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
        if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
            raise TraceError(path, "a symbolic link; not followed")
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise TraceError(path, f"cannot open the file ({e.strerror or e})") from None
    try:
        what = not_regular(os.fstat(fd).st_mode)
        if what:
            raise TraceError(path, f"not a regular file ({what}); only regular files are read")
        return _read_all(fd, limit, path)
    except OSError as e:
        raise TraceError(path, f"cannot read the file ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _read_all(fd: int, limit: int, path: str) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    got = 0
    while chunk := os.read(fd, 16 * _MIB):
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise TraceError(path, f"the file is larger than {size_text(limit)} "
                                   "(set PHASEPROF_MAX_TRACE_BYTES to read it)")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _blank_bom(buf) -> None:
    if buf[:3] == _BOM:
        buf[:3] = b"   "


def inflate(data: bytes, budget: int, path: str, deadline: float) -> bytearray:
    """Decompress gzip ``data`` (one or more members) into one buffer, in pieces, raising
    `TraceError` once the output passes ``budget`` bytes or the clock passes ``deadline``.

    The buffer is sized up front from the gzip trailer when that is within the budget (one copy
    of the output, not two); a trailer that lies only costs a resize."""
    hint = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    out = bytearray(hint if hint <= budget else 0)
    pos = 0
    rest = memoryview(data)
    try:
        while len(rest) >= 2 and rest[:2] == b"\x1f\x8b":
            unzip = zlib.decompressobj(wbits=31)
            taken = 0
            while not unzip.eof:
                if unzip.unconsumed_tail:
                    feed = unzip.unconsumed_tail
                elif taken < len(rest):
                    feed = rest[taken : taken + _PIECE]
                    taken += len(feed)
                else:
                    raise TraceError(path, "corrupt gzip data (the file ends before the compressed stream does)")
                piece = unzip.decompress(feed, _PIECE)
                if pos + len(piece) > budget:
                    raise TraceError(path, f"inflates past {size_text(budget)}, the limit for a "
                                           f"{size_text(len(data))} file (a gzip bomb?)")
                out[pos : pos + len(piece)] = piece
                pos += len(piece)
                if time.monotonic() > deadline:
                    raise TraceError(path, "took too long to decompress (see PHASEPROF_MAX_READ_SECONDS)")
            rest = memoryview(unzip.unused_data + bytes(rest[taken:])) if unzip.unused_data else rest[taken:]
    except zlib.error as e:
        raise TraceError(path, f"corrupt gzip data ({e})") from None
    if pos < len(out):
        del out[pos:]
    return out
