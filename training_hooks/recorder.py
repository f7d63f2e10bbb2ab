"""Every step's phase times, kept off the training thread: written as TensorBoard scalars under the
run, and kept for the summary printed on close.

Building and writing one event costs about 40 µs of Python (the protobuf, then TensorBoard's
pure-Python CRC-32C), more than the hook's whole budget per step. So the loop thread only appends
each finished step to a list, and hands the list over every `HANDOVER_STEPS` steps or
`HANDOVER_S` seconds; a daemon thread writes one event per step holding all its values (one
scalar per phase, same tags as `phaseprof.contract`), flushing after each batch. Scalars therefore
reach TensorBoard at most a second or so after their step. (TensorBoard's own ``EventFileWriter``
would add a second thread, and it prints a traceback on stderr when the disk fills.)
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from array import array
from collections.abc import Sequence

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from phaseprof.contract import STEP_GPU_TAG, STEP_TAG, cpu_tag, gpu_tag

from .faults import Faults
from .phases import phase_ns
from .records import StepTimes

HANDOVER_STEPS = 256
HANDOVER_S = 1.0
_HANDOVER_NS = int(HANDOVER_S * 1e9)


class PhaseStats:
    """Every step's time per phase (ms), one column per phase in order of first appearance, aligned
    by step; a phase that did not run in a step counts 0 there."""

    def __init__(self) -> None:
        self.steps = 0
        self.cpu: dict[str, array] = {}
        self.gpu_steps = 0
        self.gpu: dict[str, array] = {}

    def add(self, record: StepTimes) -> None:
        self.steps = _append(self.cpu, self.steps, {p: ns / 1e6 for p, ns in phase_ns(record.host_log).items()})
        if record.gpu_ms is not None:
            self.gpu_steps = _append(self.gpu, self.gpu_steps, record.gpu_ms)


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
        self._file: RecordWriter | None = None
        if run_dir is not None:
            try:
                self._file = _open_event_file(run_dir, worker)
            except Exception as e:  # noqa: BLE001 - no scalars, but training and the summary go on
                faults.report("could not create the scalars' event file", e)
        self._write_error: Exception | None = None  # set by the writing thread, reported by the loop's
        self._batch: list[StepTimes] = []
        self._handed_at = 0
        self._queue: queue.SimpleQueue[list[StepTimes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="phaseprof-recorder", daemon=True)
        self._thread.start()

    def add(self, records: Sequence[StepTimes], now_ns: int) -> None:
        """Take finished steps; ``now_ns`` is the loop's perf_counter_ns(), to pace the handovers."""
        self._batch += records
        if len(self._batch) >= HANDOVER_STEPS or now_ns - self._handed_at >= _HANDOVER_NS:
            self._queue.put(self._batch)
            self._batch = []
            self._handed_at = now_ns
            self._report_write_error()

    def close(self) -> None:
        """Write what is left and close the event file; the stats are complete afterwards."""
        self._queue.put(self._batch)
        self._batch = []
        self._queue.put(None)
        self._thread.join()
        if self._file is not None:
            self._stop_writing(None)
        self._report_write_error()

    def _report_write_error(self) -> None:
        if self._write_error is not None:
            self._faults.report("could not write scalars", self._write_error)
            self._write_error = None

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                for record in batch:
                    self.stats.add(record)
                    if self._file is not None:
                        self._file.write(self._event(record).SerializeToString())
                if self._file is not None:
                    self._file.flush()
            except Exception as e:  # noqa: BLE001 - stop writing, keep training
                self._stop_writing(e)

    def _event(self, record: StepTimes) -> Event:
        """One event for the step: every phase seen so far in the run (0 where it did not run), the total."""
        stats = self.stats
        values = [Summary.Value(tag=cpu_tag(p), simple_value=column[-1]) for p, column in stats.cpu.items()]
        values.append(Summary.Value(tag=STEP_TAG, simple_value=(record.host_log[-1] - record.host_log[0]) / 1e6))
        if record.gpu_ms is not None:
            values += [Summary.Value(tag=gpu_tag(p), simple_value=column[-1]) for p, column in stats.gpu.items()]
            values.append(Summary.Value(tag=STEP_GPU_TAG, simple_value=sum(record.gpu_ms.values())))
        return Event(wall_time=record.wall_time, step=record.step, summary=Summary(value=values))

    def _stop_writing(self, error: Exception | None) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except Exception as e:  # noqa: BLE001
                error = error or e
            self._file = None
        self._write_error = self._write_error or error


_file_numbers = itertools.count()


def _open_event_file(run_dir: str, worker: str) -> RecordWriter:
    """A new event file, named as TensorBoard's writers name theirs, opened with its version record."""
    os.makedirs(run_dir, exist_ok=True)
    now = time.time()
    path = os.path.join(run_dir, f"events.out.tfevents.{int(now):010d}.{worker}.{next(_file_numbers)}")
    records = RecordWriter(open(path, "xb"))  # noqa: SIM115 - open for the whole run, closed by close()
    records.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
    records.flush()
    return records
