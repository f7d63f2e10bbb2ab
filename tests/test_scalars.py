"""The reader of a run's per-step phase scalars (`plugin/reading/scalars.py`): event files written
in-process, in a local folder and on fsspec's in-memory store (a URL, read as a bucket is)."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import fsspec
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from phaseprof.contract import STEP_TAG, host_tag
from phaseprof.plugin.reading.scalars import event_files, read_scalars

FORWARD = host_tag("forward")


def event_file(folder: Path, name: str, rows: list[tuple[int, float, dict[str, float]]]) -> Path:
    """An event file named ``name`` in ``folder``: one event per row (step, wall time,
    tag -> value)."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f".{name}.writing"
    writer = EventFileWriter(str(scratch))
    for step, wall, tags in rows:
        values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in tags.items()]
        writer.add_event(
            event_pb2.Event(step=step, wall_time=wall, summary=summary_pb2.Summary(value=values))
        )
    writer.close()
    (written,) = scratch.iterdir()
    path = folder / name
    written.rename(path)
    scratch.rmdir()
    return path


def rows(scalars) -> dict[int, dict[str, float]]:
    """Each step's values by tag (NaN left out), for comparing whole answers."""
    return {
        int(s): {t: float(c[i]) for t, c in scalars.values.items() if not math.isnan(c[i])}
        for i, s in enumerate(scalars.steps)
    }


def test_steps_in_order_the_last_value_written_wins_and_other_tags_are_not_read(tmp_path):
    first = event_file(
        tmp_path,
        "events.out.tfevents.1.host",
        [
            (0, 100.0, {STEP_TAG: 10.0, FORWARD: 4.0, "loss": 2.5}),
            (2, 102.0, {STEP_TAG: 12.0}),  # no forward this step: NaN in its column
            (1, 101.0, {STEP_TAG: 11.0, FORWARD: 5.0}),
            (7, 107.0, {"loss": 1.0}),  # no phaseprof scalar: no row
        ],
    )
    second = event_file(
        tmp_path,
        "events.out.tfevents.2.host",
        [
            (2, 202.0, {STEP_TAG: 22.0, FORWARD: 6.0}),  # resumed: step 2 again, written later
            (3, 203.0, {FORWARD: 7.0}),
        ],
    )
    (tmp_path / "notes.txt").write_text("not an event file")
    s = read_scalars(str(tmp_path))
    assert s.files == [str(first), str(second)]
    assert s.steps.tolist() == [0, 1, 2, 3]
    assert s.wall_time.tolist() == [100.0, 101.0, 202.0, 203.0]
    assert sorted(s.values) == [FORWARD, STEP_TAG]
    assert rows(s) == {
        0: {STEP_TAG: 10.0, FORWARD: 4.0},
        1: {STEP_TAG: 11.0, FORWARD: 5.0},
        2: {STEP_TAG: 22.0, FORWARD: 6.0},
        3: {FORWARD: 7.0},
    }
    assert s.column(FORWARD).tolist() == [4.0, 5.0, 6.0, 7.0]
    assert s.column("phaseprof/nothing_ms") is None


def test_a_step_written_twice_keeps_only_the_last_write_of_each_tag_it_had_then(tmp_path):
    """The later write of a step replaces the step's row whole: a tag only the earlier write had
    is NaN there (that run's step is gone), and one the later write has is its value."""
    event_file(
        tmp_path,
        "events.out.tfevents.1.host",
        [(5, 1.0, {STEP_TAG: 50.0, FORWARD: 9.0}), (5, 2.0, {STEP_TAG: 51.0})],
    )
    s = read_scalars(str(tmp_path))
    assert s.steps.tolist() == [5] and s.wall_time.tolist() == [2.0]
    assert rows(s) == {5: {STEP_TAG: 51.0}}
    assert math.isnan(s.values[FORWARD][0])


def test_a_folder_without_phaseprof_scalars_has_none(tmp_path):
    assert read_scalars(str(tmp_path / "missing")) is None
    event_file(tmp_path, "events.out.tfevents.1.host", [(0, 1.0, {"loss": 1.0})])
    assert read_scalars(str(tmp_path)) is None
    assert (
        read_scalars(str(tmp_path / "events.out.tfevents.1.host")) is None
    )  # a file, not a folder


def test_event_files_are_the_folder_s_own_oldest_first(tmp_path):
    late = event_file(tmp_path, "events.out.tfevents.20.host", [(1, 1.0, {STEP_TAG: 1.0})])
    early = event_file(tmp_path, "events.out.tfevents.10.host", [(0, 1.0, {STEP_TAG: 1.0})])
    (tmp_path / "events.out.tfevents.30.folder").mkdir()  # a folder so named is no event file
    event_file(tmp_path / "eval", "events.out.tfevents.5.host", [(0, 1.0, {STEP_TAG: 1.0})])
    assert event_files(str(tmp_path)) == [str(early), str(late)]
    assert event_files(str(tmp_path / "missing")) == []


def test_a_damaged_record_ends_its_file_and_the_records_before_it_are_read(tmp_path):
    path = event_file(
        tmp_path,
        "events.out.tfevents.1.host",
        [(s, float(s), {STEP_TAG: float(s)}) for s in range(4)],
    )
    data = path.read_bytes()
    sizes = []  # each record: 8 bytes of length, 4 of its CRC, the data, 4 of its CRC
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        sizes.append(12 + length + 4)
        pos += sizes[-1]
    third = sum(sizes[:3])  # the file version record, steps 0 and 1
    broken = bytearray(data)
    broken[third + 12 : third + 12 + 4] = b"\xff\xff\xff\xff"  # step 2's event no longer parses
    path.write_bytes(bytes(broken))
    assert read_scalars(str(tmp_path)).steps.tolist() == [0, 1]
    path.write_bytes(data[: third + 11])  # step 2's header cut short
    assert read_scalars(str(tmp_path)).steps.tolist() == [0, 1]
    path.write_bytes(data[:-2])  # step 3's event whole, its CRC not yet: still being written
    assert read_scalars(str(tmp_path)).steps.tolist() == [0, 1, 2]
    path.write_bytes(data)  # the whole file, the last record ending where the file does
    assert read_scalars(str(tmp_path)).steps.tolist() == [0, 1, 2, 3]


def test_a_run_in_a_store_reads_as_the_same_run_in_a_folder(tmp_path):
    local = tmp_path / "run"
    event_file(
        local,
        "events.out.tfevents.1.host",
        [(0, 1.0, {STEP_TAG: 10.0}), (1, 2.0, {STEP_TAG: 11.0})],
    )
    event_file(local, "events.out.tfevents.2.host", [(1, 3.0, {STEP_TAG: 21.0, FORWARD: 3.0})])
    event_file(local / "eval", "events.out.tfevents.0.host", [(9, 9.0, {STEP_TAG: 99.0})])
    (local / "trace.tfevents.json").write_text("{}")  # named like one, not one: nothing read
    fs = fsspec.filesystem("memory")
    root = "/scalars-bucket/logs/run"
    for path in local.rglob("*"):
        if path.is_file():
            fs.pipe(f"{root}/{path.relative_to(local).as_posix()}", path.read_bytes())
    url = f"memory://{root}"
    try:
        assert event_files(url) == [
            f"{url}/events.out.tfevents.1.host",
            f"{url}/events.out.tfevents.2.host",
            f"{url}/trace.tfevents.json",
        ]
        remote, here = read_scalars(url + "/"), read_scalars(str(local))
        assert (
            rows(remote) == rows(here) == {0: {STEP_TAG: 10.0}, 1: {STEP_TAG: 21.0, FORWARD: 3.0}}
        )
        assert remote.wall_time.tolist() == here.wall_time.tolist() == [1.0, 3.0]
        assert remote.files == event_files(url)
        assert event_files(f"memory://{root}/missing") == []
        assert event_files("nosuchstore://bucket/run") == []  # no client for it: no files, no error
    finally:
        fs.rm("/scalars-bucket", recursive=True)
