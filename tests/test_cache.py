"""The analysis cache: a trace read once is answered from its entry while unchanged; a stale, corrupt
or foreign entry is never trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from phaseprof import analyze
from phaseprof.contract import ANALYSIS_DIR
from phaseprof.plugin import cache
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.serving.store import READY, TraceStore
from tests.logdir import settled, write_trace
from tests.tracebuilder import annotation, op, step


@pytest.fixture(autouse=True)
def cache_on(monkeypatch, tmp_path):
    monkeypatch.setenv("PHASEPROF_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))


def _trace(path, forward_us=300.0):
    events = []
    for s in range(4):
        t0 = s * 1000.0
        events += [step(s, t0, 1000), annotation("phaseprof::forward", t0 + 10, forward_us),
                   op("aten::mm", t0 + 20, forward_us - 20, **{"Input Dims": [[8, 8], [8, 8]]})]
    return write_trace(path, events)


def _forward_ms(report) -> list[float]:
    return [r["phases"]["forward"]["host_ms"] for r in report["runs"][0]["workers"][0]["steps"]]


def _entry(trace) -> str:
    return os.path.join(os.path.dirname(trace), ANALYSIS_DIR, os.path.basename(trace) + cache.SUFFIX)


def _replace_keeping_stamp(trace, data: bytes) -> None:
    """Rewrite ``trace`` with ``data`` of the same size and restore its modification time: to the
    cache it is the same file, so only a cached answer can still describe the old content."""
    st = os.stat(trace)
    assert len(data) == st.st_size
    with open(trace, "wb") as fh:
        fh.write(data)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_second_read_comes_from_the_entry_beside_the_run(tmp_path):
    trace = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    first = analyze(str(tmp_path))
    assert os.path.isfile(_entry(trace))
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)  # no longer a trace at all
    assert analyze(str(tmp_path)) == first


def test_a_changed_trace_is_read_again(tmp_path):
    trace = _trace(tmp_path / "w.1.pt.trace.json", forward_us=300)
    assert _forward_ms(analyze(str(trace))) == [0.3] * 4
    _trace(trace, forward_us=500)
    os.utime(trace, ns=(1, trace.stat().st_mtime_ns + 10**9))
    assert _forward_ms(analyze(str(trace))) == [0.5] * 4


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_corrupt_entry_is_ignored_and_replaced(tmp_path, damage):
    trace = _trace(tmp_path / "w.1.pt.trace.json")
    first = analyze(str(trace))
    entry = _entry(trace)
    with open(entry, "rb") as fh:
        data = fh.read()
    broken = {"garbage": os.urandom(len(data)), "truncated": data[: len(data) // 2], "empty": b""}[damage]
    with open(entry, "wb") as fh:
        fh.write(broken)
    assert analyze(str(trace)) == first
    with open(entry, "rb") as fh:
        assert fh.read() == data  # rewritten whole


def _forge(analysis, how: str) -> None:
    import numpy as np

    if how == "op name out of range":
        analysis.ops.name = analysis.ops.name + len(analysis.names)
    elif how == "op name one past the last":
        analysis.ops.name = np.full_like(analysis.ops.name, len(analysis.names))
    elif how == "grid of another shape":
        analysis.host_us = analysis.host_us[:, :2]
    elif how == "columns of two lengths":
        analysis.ops.calls = analysis.ops.calls[:-1]
    elif how == "steps out of order":
        analysis.ops.step = analysis.ops.step[::-1].copy()
    elif how == "text where numbers go":
        analysis.gpu_us = np.array([["x"] * analysis.gpu_us.shape[1]] * analysis.gpu_us.shape[0])
    elif how == "time outside the steps of no kind":
        analysis.apart = type(analysis.apart)(step=np.zeros(1, np.int32), kind=np.full(1, 7, np.int32),
                                                  start=np.zeros(1), end=np.ones(1))
    elif how == "GPU time outside the steps of another shape":
        analysis.apart_gpu_us = analysis.apart_gpu_us[:1]
    elif how == "ops called no times":  # a mean per call divides by it
        analysis.ops.calls = np.zeros_like(analysis.ops.calls)
    elif how == "infinite op time":
        analysis.ops.self_us = np.full_like(analysis.ops.self_us, np.inf)
    elif how == "infinite host time":
        analysis.host_us = np.full_like(analysis.host_us, -np.inf)
    elif how == "a step with no end":
        analysis.steps[1].end = float("nan")
    elif how == "a call path that calls itself":
        analysis.call_paths = type(analysis.call_paths)(parent=np.zeros(1, np.int32), name=np.zeros(1, np.int32))
        analysis.ops.stack = np.zeros_like(analysis.ops.stack)
    elif how == "a module call of no module":
        m = analysis.modules
        m.paths, m.parent = ["Net"], np.full(1, -1, np.int32)
        m.step, m.module, m.calls = np.zeros(1, np.int32), np.full(1, 3, np.int32), np.ones(1, np.int64)
        for column in ("forward_us", "forward_self_us", "forward_gpu_us", "backward_us", "backward_gpu_us"):
            setattr(m, column, np.ones(1))


@pytest.mark.parametrize("how", ["op name out of range", "op name one past the last",
                                 "grid of another shape", "columns of two lengths",
                                 "steps out of order", "text where numbers go", "time outside the steps of no kind",
                                 "GPU time outside the steps of another shape", "ops called no times",
                                 "infinite op time", "infinite host time", "a step with no end",
                                 "a call path that calls itself", "a module call of no module"])
def test_a_forged_entry_with_a_valid_key_is_not_trusted(tmp_path, how):
    """An entry whose key matches its trace but whose analysis does not hold together (written by
    someone who can write the logdir) is read again from the trace, never served."""
    trace = _trace(tmp_path / "w.1.pt.trace.json")
    first = analyze(str(trace), step=0, modules=True)  # a step's detail and modules read every table of the span
    entry = _entry(trace)
    with open(entry, "rb") as fh:
        forged = cache._decode(fh.read())
    _forge(forged.analysis, how)
    with open(entry, "wb") as fh:
        fh.write(cache._encode(forged))
    assert analyze(str(trace), step=0, modules=True) == first


def test_a_single_flipped_bit_anywhere_in_an_entry_is_caught(tmp_path):
    """Every entry carries a checksum of its bytes: a damaged entry is read again from the trace,
    never decoded into other figures (msgpack alone decodes many a flipped bit into another number)."""
    import random

    trace = _trace(tmp_path / "w.1.pt.trace.json")
    first = analyze(str(trace), step=1)
    entry = _entry(trace)
    with open(entry, "rb") as fh:
        data = fh.read()
    rng = random.Random(18)
    for bit in sorted(rng.sample(range(len(data) * 8), 150)):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with open(entry, "wb") as fh:
            fh.write(damaged)
        assert analyze(str(trace), step=1) == first, f"bit {bit} of {len(data) * 8}"
        with open(entry, "rb") as fh:
            now = fh.read()
        # read again and rewritten whole, unless the bit is one the deflated stream ignores (its content unchanged)
        assert now == data or cache._inflate(now) == cache._inflate(data)


@pytest.mark.parametrize("where", ["beside the run", "user cache"])
def test_an_entry_is_never_read_through_a_link(tmp_path, where):
    """An entry that is a symbolic link (to a forged entry outside the logdir, say) is not read."""
    trace = _trace(tmp_path / "logdir" / "w.1.pt.trace.json")
    if where == "user cache":
        (tmp_path / "logdir" / ANALYSIS_DIR).write_bytes(b"")  # no entries beside the run: the user's cache
    first = analyze(str(trace))
    entry = _entry(trace)
    if where == "user cache":
        (entry,) = (tmp_path / "user-cache").rglob("*" + cache.SUFFIX)
    with open(entry, "rb") as fh:
        forged = cache._decode(fh.read())
    forged.analysis.host_us = forged.analysis.host_us * 3  # holds together: only the figures are wrong
    outside = tmp_path / "outside.analysis"
    outside.write_bytes(cache._encode(forged))
    os.unlink(entry)
    os.symlink(outside, entry)
    assert analyze(str(trace)) == first
    assert outside.read_bytes() == cache._encode(forged)  # and nothing written through the link


def test_an_entry_of_another_analysis_version_is_not_trusted(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "w.1.pt.trace.json")
    analyze(str(trace))
    _replace_keeping_stamp(trace, trace.read_bytes().replace(b'"dur": 300', b'"dur": 400'))
    monkeypatch.setattr(cache, "_version", "another version")
    assert _forward_ms(analyze(str(trace))) == [0.4] * 4


def test_an_entry_copied_from_another_trace_is_not_trusted(tmp_path):
    a = _trace(tmp_path / "a.1.pt.trace.json", forward_us=300)
    b = _trace(tmp_path / "b.1.pt.trace.json", forward_us=500)
    analyze(str(a))
    os.makedirs(os.path.dirname(_entry(b)), exist_ok=True)
    with open(_entry(a), "rb") as src, open(_entry(b), "wb") as dst:
        dst.write(src.read())
    os.utime(b, ns=(1, a.stat().st_mtime_ns))  # same size and time: only the name tells them apart
    assert _forward_ms(analyze(str(b))) == [0.5] * 4


def test_the_entry_of_a_report_serves_a_step_detail_with_shapes(tmp_path):
    trace = _trace(tmp_path / "w.1.pt.trace.json")
    analyze(str(trace))  # a report, which shows no input shapes, fills the cache
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)
    detail = analyze(str(trace), step=1)["runs"][0]["workers"][0]["detail"]
    assert detail["ops"]["forward"][0]["shapes"] == "[[8, 8], [8, 8]]"


def test_unwritable_run_directory_uses_the_user_cache(tmp_path):
    trace = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    (tmp_path / "run" / ANALYSIS_DIR).write_text("in the way")  # the entry folder cannot be made
    first = analyze(str(trace))
    entries = list((tmp_path / "user-cache" / "phaseprof").rglob("*" + cache.SUFFIX))
    assert len(entries) == 1
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)
    assert analyze(str(trace)) == first


def test_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "off")
    trace = _trace(tmp_path / "w.1.pt.trace.json")
    analyze(str(trace))
    assert not os.path.exists(os.path.dirname(_entry(trace)))
    assert not (tmp_path / "user-cache").exists()


def test_entries_are_not_runs(tmp_path):
    _trace(tmp_path / "run" / "w.1.pt.trace.json")
    analyze(str(tmp_path))
    assert [r.name for r in discover(str(tmp_path))] == ["run"]


def test_the_cli_fills_the_cache_and_tensorboard_reuses_it(tmp_path):
    trace = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    env = {**os.environ, "PHASEPROF_CACHE": ""}
    out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", "--json", str(tmp_path)],
                         capture_output=True, text=True, env=env, check=True)
    shown = json.loads(out.stdout)
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)
    settled_stamp = trace.stat().st_mtime_ns
    settled(trace)  # the store waits for files still being written; keep the entry's key by restoring it
    os.utime(trace, ns=(settled_stamp, settled_stamp))
    store = TraceStore(str(tmp_path), settle_s=0.0)
    try:
        assert store.wait(300)
        (run,) = store.runs()
        (span,) = [store.span(f) for f in run.files]
        assert span.state == READY and span.error is None
        assert [s.number for s in span.analysis.steps] == [r["step"] for r in shown["runs"][0]["workers"][0]["steps"]]
        assert store._pool is None  # nothing was sent to a worker process to be decoded
    finally:
        store.close()


def test_cache_command_analyses_ahead_of_readers(tmp_path):
    good = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    (tmp_path / "run" / "bad.1.pt.trace.json").write_text("{")
    out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "cache", str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "PHASEPROF_CACHE": ""})
    assert out.returncode == 1 and "bad.1.pt.trace.json: not valid JSON" in out.stderr
    assert os.path.isfile(_entry(good))
    shown = analyze(str(good))
    _replace_keeping_stamp(good, b" " * good.stat().st_size)
    assert analyze(str(good)) == shown


def test_an_entry_that_inflates_past_the_limit_is_ignored(monkeypatch):
    """Entries are stored deflated: a forged one of a few KiB must not inflate to gigabytes in a reader."""
    import zlib

    monkeypatch.setattr(cache, "_MAX_ENTRY_BYTES", 1 << 20)
    bomb = cache._HEAD + zlib.compress(b"\0" * (2 << 20), 9)
    with pytest.raises(ValueError, match="larger than an entry can be"):
        cache._decode(bomb)


def test_cold_files_are_read_on_every_core_tensorboard_may_use_up_to_a_limit(tmp_path, monkeypatch):
    from phaseprof.plugin.serving import store

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert store.loaders() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert store.loaders() == store.MAX_LOADERS == 8
    assert TraceStore(str(tmp_path))._processes == 8


# -- the entry's format ---------------------------------------------------------------------------


def _rewrite_entry(trace, head: bytes, entry=None) -> None:
    """Rewrite ``trace``'s entry behind the first line ``head`` (as it is, or ``entry``)."""
    path = _entry(trace)
    with open(path, "rb") as fh:
        entry = entry or cache._decode(fh.read())
    stored = cache._encode(entry)
    with open(path, "wb") as fh:
        fh.write(head + stored[stored.index(b"\n") + 1:])


class _NewerEntry(cache.Entry):
    """An entry as a newer minor version might write it: a field this version does not know."""

    made_by: str = "phaseprof 9.9"


@pytest.mark.parametrize("head", [b"phaseprof-analysis 1.7\n", b"phaseprof-analysis-deflated\n"],
                         ids=["newer minor, extra field", "no format line (1.0)"])
def test_an_entry_of_a_newer_minor_version_or_of_none_is_used(tmp_path, head):
    """A newer minor version's entry (its extra field ignored) is read; so is one written before
    entries said their format, which is format 1.0 (its analysis version decides, as for any)."""
    trace = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    first = analyze(str(tmp_path))
    with open(_entry(trace), "rb") as fh:
        entry = cache._decode(fh.read())
    _rewrite_entry(trace, head, _NewerEntry(entry.key, entry.analysis))
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)  # only the entry can answer
    assert analyze(str(tmp_path)) == first


def test_an_entry_of_another_major_version_is_not_used_and_the_log_says_so_once(
        tmp_path, monkeypatch, caplog):
    """Entries a newer phaseprof made (format 2.0) are not used: the traces are read again, nothing
    fails, and the log has one line naming the format (not one per entry)."""
    from phaseprof import formats

    monkeypatch.setattr(formats, "_told", set())
    traces = [_trace(tmp_path / "run" / f"w{i}.1.pt.trace.json") for i in range(2)]
    analyze(str(tmp_path))
    for trace in traces:
        _rewrite_entry(trace, b"phaseprof-analysis 2.0\n")
        _replace_keeping_stamp(trace, trace.read_bytes().replace(b'"dur": 300', b'"dur": 400'))
    with caplog.at_level("INFO", logger="phaseprof.plugin.cache"):
        report = analyze(str(tmp_path))
    workers = report["runs"][0]["workers"]
    assert [w["steps"][0]["phases"]["forward"]["host_ms"] for w in workers] == [0.4] * 2
    (line,) = [r.getMessage() for r in caplog.records if "format" in r.getMessage()]
    assert "format 2.0: this phaseprof reads format 1.x" in line and "\n" not in line
    assert cache.SUFFIX in line and "the trace is read instead" in line
    with open(_entry(traces[0]), "rb") as fh:  # replaced by this version's entry
        assert fh.read().startswith(b"phaseprof-analysis 1.0\n")


def test_a_cache_directory_named_by_the_variable_holds_the_entries(tmp_path, monkeypatch):
    """``PHASEPROF_CACHE=<dir>``: a run the reader cannot write keeps its entries in ``<dir>``."""
    chosen = tmp_path / "chosen"
    monkeypatch.setenv("PHASEPROF_CACHE", str(chosen))
    trace = _trace(tmp_path / "run" / "w.1.pt.trace.json")
    (tmp_path / "run" / ANALYSIS_DIR).write_text("in the way")
    first = analyze(str(trace))
    assert len(list(chosen.rglob("*" + cache.SUFFIX))) == 1
    assert not (tmp_path / "user-cache").exists()
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)
    assert analyze(str(trace)) == first


def test_on_windows_the_user_cache_is_under_local_app_data(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
    assert cache.user_cache_dir() == os.path.join(str(tmp_path), "phaseprof", "Cache")
    monkeypatch.delenv("LOCALAPPDATA")
    assert cache.user_cache_dir() is None


def test_an_entry_loaded_names_the_file_and_worker_it_is_read_for(tmp_path):
    """One entry serves a trace under whatever worker name discovery gives it now."""
    _trace(tmp_path / "run" / "w.1.pt.trace.json")
    analyze(str(tmp_path))
    (f,) = discover(str(tmp_path))[0].files
    loaded = cache.load(f)
    assert loaded is not None and (loaded.file, loaded.worker) == (f.name, f.worker)
    assert f.worker


def test_the_analysis_version_changes_with_the_analysis_code(tmp_path, monkeypatch):
    """Entries made by other reading or analysis code are retired: its source is in the version."""
    import shutil

    here = os.path.dirname(os.path.abspath(cache.__file__))
    copy = tmp_path / "plugin"
    for folder in ("reading", "analysis"):
        shutil.copytree(os.path.join(here, folder), copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(cache.__file__, copy / "cache.py")
    monkeypatch.setattr(cache, "__file__", str(copy / "cache.py"))
    versions = []
    for folder in ("reading", "analysis"):
        monkeypatch.setattr(cache, "_version", None)
        versions.append(cache.version())
        with open(copy / folder / "__init__.py", "a") as fh:
            fh.write("# changed\n")
    monkeypatch.setattr(cache, "_version", None)
    versions.append(cache.version())
    assert len(set(versions)) == 3


def test_an_entry_with_call_paths_and_modules_answers_alone(tmp_path):
    """An entry of a trace with Python stacks and module calls (root paths and modules of parent -1)
    holds together: it answers the step detail and the modules without the trace."""
    events = []
    for s in range(3):
        t0 = s * 1000.0
        events += [step(s, t0, 1000), annotation("phaseprof::forward", t0 + 10, 500),
                   op("nn.Module: Net_0", t0 + 15, 400, cat="python_function"),
                   op("train.py(12): forward", t0 + 20, 300, cat="python_function"),
                   op("aten::mm", t0 + 30, 200, **{"Input Dims": [[8, 8], [8, 8]]})]
    trace = write_trace(tmp_path / "w.1.pt.trace.json", events)
    first = analyze(str(trace), step=1, modules=True)
    worker = first["runs"][0]["workers"][0]
    assert worker["detail"]["ops"]["forward"][0]["stack"] and worker["modules"]["modules"][0]["ops"]
    with open(_entry(trace), "rb") as fh:  # a module table of columns of two lengths is not trusted
        forged = cache._decode(fh.read())
    forged.analysis.modules.op_us = forged.analysis.modules.op_us[:0]
    with open(_entry(trace), "wb") as fh:
        fh.write(cache._encode(forged))
    assert analyze(str(trace), step=1, modules=True) == first
    _replace_keeping_stamp(trace, b" " * trace.stat().st_size)
    assert analyze(str(trace), step=1, modules=True) == first


def test_a_store_s_object_is_kept_for_its_etag_and_size_only():
    """The copy of a fetched entry answers for the same ETag and size; another version of the
    object, or one the store gave no ETag, has no copy."""
    from phaseprof.plugin.reading.discovery import TraceFile
    from phaseprof.plugin.reading.storage import Entry

    obj = Entry("s3://bucket/run/.phaseprof/w.1.pt.trace.json.analysis", 5, 0, etag="abc")
    cache.keep(obj, b"bytes")
    assert cache.kept(obj) == (None, b"bytes")
    for other in (Entry(obj.url, 5, 0, etag="abd"), Entry(obj.url, 6, 0, etag="abc"),
                  Entry(obj.url, 5, 0)):
        assert cache.kept(other) is None
    trace = TraceFile("run", "w", "s3://bucket/run/w.1.pt.trace.json", "w.1.pt.trace.json",
                      7, 0, etag="t1")
    cache.keep(obj, b"bytes", trace)
    assert cache.kept(obj) == ((7, "t1"), b"bytes")


def test_files_are_prefetched_in_batches_of_the_batch_size(tmp_path, monkeypatch):
    from phaseprof.plugin.reading.discovery import TraceFile

    monkeypatch.setattr(cache, "PREFETCH_BATCH", 2)
    files = [TraceFile(".", f"w{i}", str(tmp_path / f"w{i}.json"), f"w{i}.json", 1, 0) for i in range(5)]
    batches = [batch for batch, _ in cache.prefetched_batches(files)]
    assert batches == [files[0:2], files[2:4], files[4:]]
