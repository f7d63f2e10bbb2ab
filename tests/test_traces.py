"""Where the profiler's traces go (`training_hooks/traces.py`), in this process: a small real
torch.profiler handed to `TraceWriter`, the background stood in for by one that finishes each trace
here (compressing it with the same function the background process runs), and the worker's name
with and without torch.distributed."""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from phaseprof.contract import TRACE_FILE_RE
from phaseprof.trace_files import compress_into_place
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.traces import TraceWriter, worker_name


class Background:
    """`SourceAnalysis` as the writer uses it: ``start`` records the trace to analyse, ``compress``
    compresses it into place at once (``fail``: raises instead, as a failed thread start would)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started: list[str] = []
        self.compressed: list[str] = []

    def start(self, trace: str) -> None:
        self.started.append(trace)

    def compress(self, exported: str) -> str:
        self.compressed.append(exported)
        if self.fail:
            open(exported[: -len(".part")] + ".gz.part", "wb").close()  # half written
            raise OSError(28, "No space left on device")
        return compress_into_place(exported)


def _profile() -> torch.profiler.profile:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.nn.Linear(4, 2)(torch.ones(3, 4)).sum()
    return prof


def _writer(tmp_path, use_gzip: bool, background: Background) -> tuple[TraceWriter, str]:
    run_dir = str(tmp_path / "logs" / "run")  # not there yet: made by the writer
    return TraceWriter(run_dir, "host_1", use_gzip, Faults(run_dir), background), run_dir


def test_a_plain_trace_is_renamed_into_place_and_handed_to_the_analysis(tmp_path):
    background = Background()
    writer, run_dir = _writer(tmp_path, False, background)
    before = time.time_ns()
    writer(_profile())
    (name,) = os.listdir(run_dir)
    match = TRACE_FILE_RE.match(name)
    assert match and match["worker"] == "host_1" and name.endswith(".pt.trace.json")
    assert before <= int(name.split(".")[1]) <= time.time_ns()  # the span's time, in ns
    path = os.path.join(run_dir, name)
    assert writer.written == [path] and background.started == [path] and background.compressed == []
    events = json.loads(Path(path).read_text(encoding="utf-8"))["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)
    assert writer.faults.summary() == []


def test_a_gzipped_trace_is_compressed_into_place_by_the_background(tmp_path):
    background = Background()
    writer, run_dir = _writer(tmp_path, True, background)
    writer(_profile())
    (name,) = os.listdir(run_dir)  # the export is gone, and no partial file is left
    assert name.endswith(".pt.trace.json.gz") and TRACE_FILE_RE.match(name)["worker"] == "host_1"
    path = os.path.join(run_dir, name)
    assert background.compressed == [path[: -len(".gz")] + ".part"] and background.started == []
    assert writer.written == [path]
    events = json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)


class Exporter:
    """A profiler whose export fails as torch's does on a full disk: it logs, leaves a ``.tmp`` file
    and returns normally."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        self.paths.append(path)
        open(path + ".tmp", "w").close()


def test_an_export_that_wrote_nothing_is_reported_and_leaves_nothing(tmp_path):
    writer, run_dir = _writer(tmp_path, True, Background())
    profiler = Exporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer(profiler)
    assert os.listdir(run_dir) == [] and writer.written == []
    (exported,) = profiler.paths
    assert exported.startswith(os.path.join(run_dir, "host_1.")) and exported.endswith(".pt.trace.json.part")
    line = f"could not write traces: OSError: torch.profiler could not write them in {run_dir} (is the disk full?)"
    assert writer.faults.summary() == [line]
    (warning,) = [str(w.message) for w in caught]
    assert line in warning and "Training goes on" in warning
    writer(profiler)  # the same cause again: counted, not a new line
    assert writer.faults.summary() == [line + " (2 times)"]


def test_a_failed_compression_is_reported_and_its_files_removed(tmp_path):
    background = Background(fail=True)
    writer, run_dir = _writer(tmp_path, True, background)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        writer(_profile())
    assert os.listdir(run_dir) == [] and writer.written == []
    assert writer.faults.summary() == ["could not write traces: OSError: [Errno 28] No space left on device"]


def test_a_run_folder_that_cannot_be_made_is_reported(tmp_path):
    (tmp_path / "logs").write_text("a file where the run's folder should be")
    background = Background()
    writer, run_dir = _writer(tmp_path, False, background)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        writer(_profile())  # never raises into the loop
    assert writer.written == [] and background.started == []
    (line,) = writer.faults.summary()
    assert line.startswith("could not write traces: NotADirectoryError: ")


def test_the_worker_is_the_host_and_process_and_its_rank_under_torch_distributed(tmp_path):
    plain = f"{socket.gethostname()}_{os.getpid()}"
    assert worker_name() == plain
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert worker_name() == f"rank0.{plain}"
    finally:
        dist.destroy_process_group()
