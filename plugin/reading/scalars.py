"""Read the every-step phase scalars a run's event files hold, without TensorBoard's loaders.

An event file is a sequence of TFRecords (length, its CRC, the data, its CRC); each record is one
`Event` protobuf. TensorBoard's Python loader checks both CRCs in pure Python and wraps every value
in objects: ~10 s for 50,000 steps. Here the framing is walked directly and each record parsed by
protobuf's C implementation, keeping only the ``phaseprof/`` scalars: ~0.3 s for the same file.
The CRCs are not checked; a record that does not parse, or a file cut short while being written,
ends the reading of that file at the last whole record.

No torch and no TensorFlow: the protobuf classes come with TensorBoard.
"""

from __future__ import annotations

import os
import struct

import msgspec
import numpy as np

from phaseprof.contract import EVENT_FILE_MARKER, SCALAR_PREFIX

from . import storage
from .errors import TraceError

_HEADER = struct.Struct("<Q")
#: An event file in an object store larger than this is not downloaded.
_MAX_EVENT_FILE_BYTES = 4 << 30


class Scalars(msgspec.Struct):
    """A run's phaseprof scalars: one row per step, in step order; a column per tag (NaN where a step
    has no value of that tag)."""

    steps: np.ndarray  # int64, increasing
    wall_time: np.ndarray  # float64 seconds since the epoch, when the step was written
    values: dict[str, np.ndarray]  # tag -> float64 per step
    files: list[str]  # event files read, in order

    def column(self, tag: str) -> np.ndarray | None:
        return self.values.get(tag)


def event_files(directory: str) -> list[str]:
    """The TensorBoard event files directly in ``directory``, oldest first (their names start with
    the time they were opened)."""
    if storage.is_remote(directory):
        prefix = storage.normalize(directory) + "/"
        try:
            entries = storage.listing(directory)
        except (OSError, ValueError, storage.StorageError):
            return []
        return [e.url for e in entries
                if "/" not in e.url[len(prefix):] and EVENT_FILE_MARKER in storage.basename(e.url)]
    try:
        names = sorted(n for n in os.listdir(directory) if EVENT_FILE_MARKER in n)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]


def read_scalars(directory: str) -> Scalars | None:
    """The phaseprof scalars of the event files directly in ``directory``, or None if they hold none.
    Where files repeat a step (a run resumed into the same directory), the last value written wins."""
    files = event_files(directory)
    steps: list[int] = []
    wall: list[float] = []
    cells: dict[str, tuple[list[int], list[float]]] = {}  # tag -> (rows, values)
    for path in files:
        _read(path, steps, wall, cells)
    if not steps:
        return None
    # the last row of each step number, in step order
    raw = np.array(steps, dtype=np.int64)
    last = len(raw) - 1 - np.unique(raw[::-1], return_index=True)[1]
    row_of = np.full(len(raw), -1, dtype=np.int64)
    row_of[last] = np.arange(len(last))
    values = {}
    for tag, (rows, vals) in sorted(cells.items()):
        column = np.full(len(last), np.nan)
        at = row_of[np.array(rows, dtype=np.int64)]
        keep = at >= 0
        column[at[keep]] = np.array(vals)[keep]
        values[tag] = column
    return Scalars(steps=raw[last], wall_time=np.array(wall)[last], values=values, files=files)


def _read(path: str, steps: list[int], wall: list[float], cells: dict[str, tuple[list[int], list[float]]]) -> None:
    """Append the events with phaseprof scalars of one event file: a row each (step, wall time), and
    each value to its tag's cells."""
    from tensorboard.compat.proto.event_pb2 import Event  # ~20 ms: only where there are scalars to read

    try:
        if storage.is_remote(path):
            data = storage.read(path, _MAX_EVENT_FILE_BYTES)
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except (OSError, TraceError):
        return
    event = Event()
    pos, end = 0, len(data)
    prefix = SCALAR_PREFIX
    while pos + 12 <= end:
        (length,) = _HEADER.unpack_from(data, pos)
        start = pos + 12
        if start + length + 4 > end:
            return  # the last record is still being written
        try:
            event.ParseFromString(data[start:start + length])
        except Exception:  # noqa: BLE001 - protobuf's DecodeError; a damaged file ends here
            return
        pos = start + length + 4
        row = -1
        for v in event.summary.value:
            if v.tag.startswith(prefix):  # written as simple values (ours, and SummaryWriter.add_scalar's)
                if row < 0:
                    row = len(steps)
                    steps.append(event.step)
                    wall.append(event.wall_time)
                rows, vals = cells.setdefault(v.tag, ([], []))
                rows.append(row)
                vals.append(v.simple_value)
