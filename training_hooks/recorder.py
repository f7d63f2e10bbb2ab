"""Every step's phase times, kept off the training thread: written as TensorBoard scalars under the
run, and kept for the summary printed on close.

Building and writing one event costs several µs of Python (the protobuf and its record), a good
share of the hook's whole budget per step (TensorBoard's own record writer computes the records'
CRC-32C in pure Python: tens to hundreds of µs an event; `EventFile` uses ``google-crc32c``'s C).
So the loop thread only appends each finished step to a list, and hands the list over every
`HANDOVER_STEPS` steps or `HANDOVER_S` seconds; a daemon thread writes one event per step holding all its values (one
scalar per phase, same tags as `phaseprof.contract`), flushing after each batch. When the loop
hands nothing over for `FLUSH_S` seconds (a long evaluation, a hung step), that thread takes the
waiting steps itself. Scalars therefore reach the disk a second or two after their step, and a run
that is killed keeps all but its last seconds. (TensorBoard's own ``EventFileWriter`` would add a
second thread, and it prints a traceback on stderr when the disk fills.)

A step's scalars leave out the time kept outside the steps (evaluation passes, ``prof.paused()``):
its evaluation time has a tag of its own, as has the profiler's own time after the step. An
evaluation pass runs from its first evaluation forward to the next training work, across a step
boundary if ``prof.step()`` came in between: it is one pass, written whole at the step where it
ended (`PhaseStats.add`), never a pass and a tail of microseconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import struct
import threading
import time
from array import array
from collections import deque
from collections.abc import Sequence

import google_crc32c
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from phaseprof.contract import (
    EVAL,
    EVAL_TAG,
    HOOK_TAG,
    OUT_OF_STEP,
    PROFILER_TAG,
    STEP_GPU_TAG,
    STEP_TAG,
    gpu_tag,
    host_tag,
)

from .faults import Faults
from .records import StepTimes
from .tracker import AFTER_LAST, HOOK, phase_ns

#: Segments of a step's log that neither lengthen nor end an evaluation pass open around them.
_NEUTRAL = frozenset((*OUT_OF_STEP, AFTER_LAST, HOOK)) - {EVAL}

HANDOVER_STEPS = 256
HANDOVER_S = 1.0
_HANDOVER_NS = int(HANDOVER_S * 1e9)
FLUSH_S = 2.0


class PhaseStats:
    """Every training step's time per phase (ms), one column per phase in order of first
    appearance, aligned by step; a phase that did not run in a step counts 0 there. Beside them,
    per step: its number, the hook's own ms in it, the profiler's own ms after it; each evaluation
    pass's ms; the ms from
    the last step to close that were no pass."""

    def __init__(self) -> None:
        self.steps = 0
        self.numbers = array("q")
        self.cpu: dict[str, array] = {}
        self.gpu_steps = 0
        self.gpu: dict[str, array] = {}
        self.profiler_ms = array("d")
        self.hook_ms = array("d")
        self.eval_ms = array("d")  # one value per evaluation pass
        self.after_last_ms = 0.0
        self._pass_ns = 0  # the evaluation pass open at the end of the last step taken

    def add(self, record: StepTimes) -> tuple[float, float, float]:
        """Take one step (in order); returns (the ms of the evaluation passes that ended in it, the
        profiler's ms after it, the hook's ms in it)."""
        passes = self._passes(record)
        self.eval_ms.extend(passes)
        eval_ms = sum(passes)
        host = {p: ns / 1e6 for p, ns in phase_ns(record.host_log).items()}
        self.after_last_ms += host.pop(AFTER_LAST, 0.0)
        hook_ms = host.pop(HOOK, 0.0)
        for phase in OUT_OF_STEP:
            host.pop(phase, None)
        profiler_ms = record.profiler_ns / 1e6
        if record.training:
            self.steps = _append(self.cpu, self.steps, host)
            self.numbers.append(record.step)
            self.profiler_ms.append(profiler_ms)
            self.hook_ms.append(hook_ms)
            if record.gpu_ms is not None:
                gpu = {p: ms for p, ms in record.gpu_ms.items() if p not in OUT_OF_STEP}
                self.gpu_steps = _append(self.gpu, self.gpu_steps, gpu)
        return eval_ms, profiler_ms, hook_ms


    def _passes(self, record: StepTimes) -> list[float]:
        """The ms of each evaluation pass that ended in ``record``: one open at its start began in
        an earlier step; one open at its end goes on into the next (or ends here at close)."""
        log, passes, ns = record.host_log, [], self._pass_ns
        for i in range(1, len(log), 2):
            phase = log[i]
            if phase == EVAL:
                ns += log[i + 1] - log[i - 1]
            elif ns and phase not in _NEUTRAL:
                passes.append(ns / 1e6)
                ns = 0
        if ns and record.final:
            passes.append(ns / 1e6)
            ns = 0
        self._pass_ns = ns
        return passes


def _append(columns: dict[str, array], rows: int, values: dict[str, float]) -> int:
    for phase in values:
        if phase not in columns:
            columns[phase] = array("d", bytes(8 * rows))
    for phase, column in columns.items():
        column.append(values.get(phase, 0.0))
    return rows + 1


class StepRecorder:
    """Takes finished steps on the loop thread (`add`), writes and tallies them on its own thread.

    ``run_dir`` None keeps the figures for the summary without writing scalars.
    """

    def __init__(self, run_dir: str | None, worker: str, faults: Faults) -> None:
        self.stats = PhaseStats()
        self._faults = faults
        self._file: EventFile | None = None
        if run_dir is not None:
            try:
                self._file, self._file_path = _open_event_file(run_dir, worker)
            except Exception as e:  # noqa: BLE001 - no scalars, but training and the summary go on
                faults.report("could not create the scalars' event file", e)
        self._write_error: Exception | None = None  # set by the writing thread, reported by the loop's
        self._lock = threading.RLock()  # the batch; re-entrant: close() may run in a signal handler
        self._batch: list[StepTimes] = []
        self._handed_at = 0
        self._queue: queue.SimpleQueue[list[StepTimes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="phaseprof-recorder", daemon=True)
        self._thread.start()

    def add(self, records: Sequence[StepTimes], now_ns: int) -> None:
        """Take finished steps; ``now_ns`` is the loop's perf_counter_ns(), to pace the handovers."""
        with self._lock:
            self._batch += records
            if len(self._batch) >= HANDOVER_STEPS or now_ns - self._handed_at >= _HANDOVER_NS:
                self._hand_over()
                self._handed_at = now_ns
        if self._write_error is not None:
            self._report_write_error()

    def _hand_over(self) -> None:
        with self._lock:
            if self._batch:
                self._queue.put(self._batch)
                self._batch = []

    def close(self) -> None:
        """Write what is left and close the event file; the stats are complete afterwards."""
        self._hand_over()
        self._queue.put(None)
        self._thread.join()
        self._report_write_error()
        if self._file is not None:
            unwritten = self._file.close()
            self._file = None
            if unwritten:
                self._faults.report("could not write the scalars of the last steps", RuntimeError(
                    f"{unwritten} record(s) found no room in {self._file_path}; the summary counts "
                    "their steps"))

    def _report_write_error(self) -> None:
        if self._write_error is not None:
            self._faults.report("could not write scalars", self._write_error)
            self._write_error = None

    def _run(self) -> None:
        while True:
            try:
                batch = self._queue.get(timeout=FLUSH_S)
            except queue.Empty:
                self._hand_over()  # the loop is busy elsewhere: take its waiting steps
                continue
            if batch is None:
                return
            try:
                events = []
                for record in batch:  # every step is tallied, whatever the file does
                    apart = self.stats.add(record)
                    if self._file is not None:
                        events.append(self._event(record, *apart).SerializeToString())
                if self._file is not None:
                    self._file.write(events)  # kept for the next write if it fails (a full disk)
            except Exception as e:  # noqa: BLE001 - keep training
                self._write_error = self._write_error or e

    def _event(self, record: StepTimes, eval_ms: float, profiler_ms: float,
               hook_ms: float) -> Event:
        """One event for the step: every phase seen so far in the run (0 where it did not run), the
        total, and the evaluation, profiler and hook times around it where there were any."""
        stats = self.stats
        values = []
        if record.training:
            values += [Summary.Value(tag=host_tag(p), simple_value=column[-1]) for p, column in stats.cpu.items()]
            values.append(Summary.Value(tag=STEP_TAG, simple_value=sum(column[-1] for column in stats.cpu.values())))
            if record.gpu_ms is not None:
                gpu = [(p, column[-1]) for p, column in stats.gpu.items()]
                values += [Summary.Value(tag=gpu_tag(p), simple_value=ms) for p, ms in gpu]
                values.append(Summary.Value(tag=STEP_GPU_TAG, simple_value=sum(ms for _, ms in gpu)))
        if eval_ms:
            values.append(Summary.Value(tag=EVAL_TAG, simple_value=eval_ms))
        if profiler_ms:
            values.append(Summary.Value(tag=PROFILER_TAG, simple_value=profiler_ms))
        if hook_ms and record.training:
            values.append(Summary.Value(tag=HOOK_TAG, simple_value=hook_ms))
        return Event(wall_time=record.wall_time, step=record.step, summary=Summary(value=values))


_file_numbers = itertools.count()


def frame(data: bytes) -> bytes:
    """One record in TFRecord framing, as TensorBoard's ``RecordWriter`` writes it: its length, the
    masked CRC-32C of the length, the data and the masked CRC-32C of the data."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header))
            + data + struct.pack("<I", masked_crc32c(data)))


class EventFile:
    """An event file written a batch of records at a time. A batch that cannot be written (a
    full disk) is cut back to the last whole record, so a reader never meets half a record, and
    kept to be written with the next batch: the scalars resume, complete, once there is room."""

    #: Records kept while the disk has no room; beyond, the oldest go (their steps stay counted).
    MAX_PENDING_BYTES = 64 << 20

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        self._fd = os.open(path, flags, 0o644)
        self._size = 0  # bytes of whole records in the file
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._dropped = 0

    def write(self, records: Sequence[bytes]) -> None:
        """Write ``records`` after any kept from failed writes; OSError, keeping them all, if it
        fails."""
        for data in records:
            self._pending.append(frame(data))
            self._pending_bytes += len(self._pending[-1])
        while self._pending_bytes > self.MAX_PENDING_BYTES:
            self._pending_bytes -= len(self._pending.popleft())
            self._dropped += 1
        data = memoryview(b"".join(self._pending))
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            os.ftruncate(self._fd, self._size)  # no torn record: it would end what readers can read
            os.lseek(self._fd, self._size, os.SEEK_SET)
            raise
        self._size += len(data)
        self._pending.clear()
        self._pending_bytes = 0

    def close(self) -> int:
        """Close it; returns how many records were never written."""
        os.close(self._fd)
        return len(self._pending) + self._dropped


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C of ``data``, masked as TFRecord files store it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _open_event_file(run_dir: str, worker: str) -> tuple[EventFile, str]:
    """A new event file, named as TensorBoard's writers name theirs, begun with its version
    record."""
    os.makedirs(run_dir, exist_ok=True)
    now = time.time()
    path = os.path.join(run_dir, f"events.out.tfevents.{int(now):010d}.{worker}.{next(_file_numbers)}")
    records = EventFile(path)
    with contextlib.suppress(OSError):  # no room yet: the version record goes with the first steps
        records.write([Event(wall_time=now, file_version="brain.Event:2").SerializeToString()])
    return records, path
