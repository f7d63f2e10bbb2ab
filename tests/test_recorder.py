"""The step recorder (`training_hooks/recorder.py`) in this process, fed hand-made steps: the figures
kept for the summary (`PhaseStats`), the scalars as TensorBoard reads them back, and an event file
on a disk that fills (``os.write`` stood in for by one that runs out of room)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from phaseprof.training_hooks import recorder
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.recorder import EventFile, PhaseStats, StepRecorder, frame
from phaseprof.training_hooks.records import StepTimes

MS = 1_000_000  # ns


def log(*segments: tuple[str, float]) -> list:
    """A step's host log from (phase, ms) segments, starting at 0."""
    out, t = [0], 0
    for phase, ms in segments:
        t += int(ms * MS)
        out += [phase, t]
    return out


def test_each_step_s_phases_are_columns_aligned_by_step():
    stats = PhaseStats()
    assert stats.add(StepTimes(7, 1.0, log(("forward", 2), ("hook", 0.5), ("backward", 3), ("forward", 1)),
                               profiler_ns=4 * MS)) == (0.0, 4.0, 0.5)
    stats.add(StepTimes(8, 2.0, log(("data", 5), ("backward", 1)), gpu_ms={"forward": 1.5, "eval": 9.0}))
    stats.add(StepTimes(9, 3.0, log(("forward", 1)), gpu_ms={"backward": 2.0}))
    assert stats.steps == 3 and list(stats.numbers) == [7, 8, 9]
    assert {p: list(c) for p, c in stats.cpu.items()} == {
        "forward": [3.0, 0.0, 1.0], "backward": [3.0, 1.0, 0.0], "data": [0.0, 5.0, 0.0]}
    assert list(stats.cpu) == ["forward", "backward", "data"]  # in order of first appearance
    assert stats.gpu_steps == 2  # the steps that had GPU times, without the evaluation's
    assert {p: list(c) for p, c in stats.gpu.items()} == {"forward": [1.5, 0.0], "backward": [0.0, 2.0]}
    assert list(stats.hook_ms) == [0.5, 0.0, 0.0] and list(stats.profiler_ms) == [4.0, 0.0, 0.0]


def test_time_kept_apart_is_in_no_step_s_phases():
    stats = PhaseStats()
    eval_ms, profiler_ms, hook_ms = stats.add(StepTimes(
        0, 1.0, log(("forward", 2), ("paused", 7), ("eval", 3), ("hook", 1), ("backward", 1),
                    ("after the last step", 6))))
    assert (eval_ms, profiler_ms, hook_ms) == (3.0, 0.0, 1.0)
    assert {p: list(c) for p, c in stats.cpu.items()} == {"forward": [2.0], "backward": [1.0]}
    assert list(stats.eval_ms) == [3.0] and stats.after_last_ms == 6.0


def test_an_evaluation_pass_across_a_step_boundary_is_one_pass_where_it_ends():
    stats = PhaseStats()
    # the pass begins in step 0, goes on through the hook's time and a pause, ends in step 1
    assert stats.add(StepTimes(0, 1.0, log(("forward", 1), ("eval", 4))))[0] == 0.0
    assert stats.add(StepTimes(1, 2.0, log(("eval", 2), ("hook", 1), ("paused", 1), ("eval", 1),
                                           ("forward", 1), ("eval", 0.5), ("data", 1))))[0] == 7.5
    assert list(stats.eval_ms) == [7.0, 0.5]
    # one left open at close ends with the part-step that holds no training work
    stats.add(StepTimes(2, 3.0, log(("eval", 2))))
    last = StepTimes(3, 4.0, log(("eval", 1), ("after the last step", 1)), training=False, final=True)
    assert stats.add(last) == (3.0, 0.0, 0.0)
    assert list(stats.eval_ms) == [7.0, 0.5, 3.0] and stats.steps == 3 and list(stats.numbers) == [0, 1, 2]
    assert stats.after_last_ms == 1.0


def _events(run_dir) -> list:
    (name,) = os.listdir(run_dir)
    return [Event.FromString(r) for r in RawEventFileLoader(os.path.join(run_dir, name)).Load()]


def _scalars(event) -> dict[str, float]:
    return {v.tag: round(v.simple_value, 4) for v in event.summary.value}


def test_the_scalars_hold_every_phase_seen_so_far_and_the_time_around_the_step(tmp_path):
    faults = Faults(str(tmp_path))
    steps = StepRecorder(str(tmp_path / "run"), "host_1", faults)
    steps.add([StepTimes(0, 100.0, log(("forward", 2), ("hook", 0.25)), gpu_ms={"forward": 1.0}),
               StepTimes(1, 101.0, log(("eval", 3), ("backward", 1)), profiler_ns=2 * MS)], 0)
    steps.add([StepTimes(2, 102.0, log(("forward", 1), ("eval", 1)), gpu_ms=None),
               StepTimes(3, 103.0, log(("eval", 2), ("hook", 0.5)), training=False, final=True)], 1)
    steps.close()
    assert faults.summary() == []
    (name,) = os.listdir(tmp_path / "run")
    assert name.startswith("events.out.tfevents.") and ".host_1." in name
    version, *events = _events(tmp_path / "run")
    assert version.file_version == "brain.Event:2"
    assert [(e.step, e.wall_time) for e in events] == [(0, 100.0), (1, 101.0), (2, 102.0), (3, 103.0)]
    assert [_scalars(e) for e in events] == [
        {"phaseprof/forward_ms": 2.0, "phaseprof/step_ms": 2.0, "phaseprof/forward_gpu_ms": 1.0,
         "phaseprof/step_gpu_ms": 1.0, "phaseprof/hook_ms": 0.25},
        {"phaseprof/forward_ms": 0.0, "phaseprof/backward_ms": 1.0, "phaseprof/step_ms": 1.0,
         "phaseprof/eval_ms": 3.0, "phaseprof/profiler_ms": 2.0},
        {"phaseprof/forward_ms": 1.0, "phaseprof/backward_ms": 0.0, "phaseprof/step_ms": 1.0},
        {"phaseprof/eval_ms": 3.0},  # no training work: the pass alone, and no hook time
    ]
    assert list(steps.stats.numbers) == [0, 1, 2]


def test_steps_are_handed_to_the_writing_thread_every_second_or_full_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "FLUSH_S", 3600.0)  # the thread never takes them by itself here
    steps = StepRecorder(str(tmp_path / "run"), "w", Faults(str(tmp_path)))
    try:
        (thread,) = [t for t in threading.enumerate() if t.name == "phaseprof-recorder"]
        assert thread.daemon  # a run never closed does not keep the process from exiting
        steps.add([StepTimes(0, 1.0, log(("forward", 1)))], recorder._HANDOVER_NS - 1)
        assert len(steps._batch) == 1  # kept: under a second since the recorder began
        steps.add([StepTimes(1, 1.0, log(("forward", 1)))], recorder._HANDOVER_NS)  # a second on
        assert steps._batch == []
        done = threading.Event()
        while not done.wait(0.01):  # written by the recorder's thread
            done.set() if len(_events(tmp_path / "run")) == 3 else None
        assert [e.step for e in _events(tmp_path / "run")[1:]] == [0, 1]
        for step in range(2, 1 + recorder.HANDOVER_STEPS):  # within a second of the last handover
            steps.add([StepTimes(step, 1.0, log(("forward", 1)))], 2 * recorder._HANDOVER_NS - 1)
        assert len(steps._batch) == recorder.HANDOVER_STEPS - 1
        steps.add([StepTimes(300, 1.0, log(("forward", 1)))], 2 * recorder._HANDOVER_NS - 1)
        assert steps._batch == []  # a full batch goes at once
        done.clear()
        while not done.wait(0.01):
            done.set() if len(_events(tmp_path / "run")) == 3 + recorder.HANDOVER_STEPS else None
    finally:
        steps.close()


def test_the_steps_waiting_are_taken_when_the_loop_hands_nothing_over(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "FLUSH_S", 0.01)
    steps = StepRecorder(str(tmp_path / "run"), "w", Faults(str(tmp_path)))
    try:
        steps.add([StepTimes(0, 1.0, log(("forward", 1)))], 1)  # too soon for a handover
        done = threading.Event()
        while not done.wait(0.01):
            done.set() if len(_events(tmp_path / "run")) == 2 else None
    finally:
        steps.close()


def test_no_run_folder_keeps_the_figures_without_scalars(tmp_path):
    faults = Faults(str(tmp_path))
    steps = StepRecorder(None, "w", faults)
    steps.add([StepTimes(0, 1.0, log(("forward", 1)))], 0)
    steps.close()
    assert list(steps.stats.cpu["forward"]) == [1.0] and faults.summary() == []


def test_an_event_file_that_cannot_be_made_is_reported_and_the_steps_still_counted(tmp_path):
    (tmp_path / "run").write_text("a file where the run's folder should be")
    faults = Faults(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="could not create the scalars' event file"):
        steps = StepRecorder(str(tmp_path / "run"), "w", faults)
    steps.add([StepTimes(0, 1.0, log(("forward", 1)))], 0)
    steps.close()
    (line,) = faults.summary()
    assert line.startswith("could not create the scalars' event file: FileExistsError")
    assert steps.stats.steps == 1


class Disk:
    """``os.write`` on a disk with ``room`` bytes left for the event file's descriptor ``fd``."""

    def __init__(self, monkeypatch, fd: int, room: int) -> None:
        self.fd, self.room, self._write = fd, room, os.write
        monkeypatch.setattr(os, "write", self)

    def __call__(self, fd: int, data) -> int:
        if fd != self.fd:
            return self._write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self._write(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def test_a_full_disk_cuts_the_file_back_to_whole_records_and_writes_them_once_there_is_room(
        tmp_path, monkeypatch):
    path = str(tmp_path / "events")
    records = EventFile(path)
    disk = Disk(monkeypatch, records._fd, room=len(frame(b"one")) + 3)
    with pytest.raises(OSError):
        records.write([b"one", b"two"])  # room for the first and part of the second
    assert Path(path).read_bytes() == b""  # the batch is written whole or not at all
    with pytest.raises(OSError):
        records.write([b"three"])
    assert os.path.getsize(path) == 0
    disk.room = 1 << 20
    records.write([b"four"])
    records.write([b"five"])
    assert records.close() == 0
    assert Path(path).read_bytes() == b"".join(frame(r) for r in (b"one", b"two", b"three", b"four", b"five"))


def test_what_is_kept_for_a_full_disk_counts_only_records_not_yet_written(tmp_path, monkeypatch):
    path = str(tmp_path / "events")
    records = EventFile(path)
    monkeypatch.setattr(EventFile, "MAX_PENDING_BYTES", 2 * len(frame(b"1")))
    disk = Disk(monkeypatch, records._fd, room=len(frame(b"0")))
    records.write([b"0"])
    for data in (b"1", b"2"):  # kept, both: exactly what may be kept
        with pytest.raises(OSError):
            records.write([data])
    disk.room = 1 << 20
    records.write([])
    assert records.close() == 0
    assert Path(path).read_bytes() == frame(b"0") + frame(b"1") + frame(b"2")


def test_records_beyond_what_is_kept_are_dropped_oldest_first_and_counted(tmp_path, monkeypatch):
    path = str(tmp_path / "events")
    records = EventFile(path)
    monkeypatch.setattr(EventFile, "MAX_PENDING_BYTES", 2 * len(frame(b"1")))
    disk = Disk(monkeypatch, records._fd, room=0)
    for data in (b"1", b"2", b"3"):
        with pytest.raises(OSError):
            records.write([data])
    disk.room = len(frame(b"1")) * 2
    records.write([])
    assert Path(path).read_bytes() == frame(b"2") + frame(b"3")
    with pytest.raises(OSError):
        records.write([b"4"])
    assert records.close() == 2  # "1", dropped, and "4", never written


def test_scalars_lost_to_a_full_disk_are_reported_and_the_steps_counted(tmp_path, monkeypatch):
    faults = Faults(str(tmp_path))
    steps = StepRecorder(str(tmp_path / "run"), "w", faults)
    disk = Disk(monkeypatch, steps._file._fd, room=0)
    with pytest.warns(RuntimeWarning, match="could not write scalars"):
        steps.add([StepTimes(0, 1.0, log(("forward", 1)))], recorder._HANDOVER_NS)
        done = threading.Event()
        while not done.wait(0.01):  # the writing thread met the full disk
            done.set() if steps._write_error is not None else None
        steps.add([], recorder._HANDOVER_NS)  # reported on the loop's next call
    steps.add([StepTimes(1, 1.0, log(("forward", 1)))], 2 * recorder._HANDOVER_NS)
    steps.close()
    assert disk.room == 0 and steps.stats.steps == 2
    name = os.listdir(tmp_path / "run")[0]
    # once on the loop's next call, again at close (the next batch met the same full disk)
    assert faults.summary()[0] == "could not write scalars: OSError: [Errno 28] No space left on device (2 times)"
    assert faults.summary()[-1] == (
        "could not write the scalars of the last steps: RuntimeError: 2 record(s) found no room in "
        f"{tmp_path / 'run' / name}; the summary counts their steps")
