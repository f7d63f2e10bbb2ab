"""The step index (`plugin/step_index.py`): every step's trace cut written beside the analysis when a
trace is first analysed, served without decoding the trace again — the same document as a full read,
event for event, and never used once it no longer matches its trace."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import msgspec
import pytest

from phaseprof.plugin import cache, step_index
from phaseprof.plugin.analysis.step_trace import StepCutter, step_trace
from phaseprof.plugin.reading.decode import read_trace
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.serving.loading import load
from phaseprof.plugin.serving.store import TraceStore
from phaseprof.plugin.spans import analyze_file
from tests.logdir import evaluation_run, settled, write_trace
from tests.tracebuilder import Loop

GPU_FOLDERS = ["hta_alexnet_2stream", "hta_event_sync_3stream", "hta_nccl_16rank", "hta_ns_resolution",
               "hta_sampled_2rank", "kineto_resnet50_num_workers_0"]


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """The cache on, in a folder of the test's own (the tests run with it off)."""
    monkeypatch.setenv("PHASEPROF_CACHE", str(tmp_path / "user-cache"))
    return tmp_path


def settled_evaluation_logdir(tmp) -> object:
    """A logdir of one evaluation run, its files old enough for TensorBoard to read at once."""
    root = tmp / "logdir"
    evaluation_run(root / "eval")
    for p in root.rglob("*"):
        settled(p)
    return root


def trace_files(root) -> list:
    return [f for run in discover(str(root)) for f in run.files]


def full_read(f, number: int, trace=None) -> list[dict] | None:
    """The step's events as the full read cuts them (decoded afresh, no index involved)."""
    doc = step_trace(trace or read_trace(f.path), number)
    return None if doc is None else msgspec.json.decode(msgspec.json.encode(doc))["traceEvents"]


def assert_index_equals_full_read(root) -> int:
    """Every step of every trace under ``root`` from its index equals the full read's; returns how many
    device events were compared."""
    device = 0
    files = trace_files(root)
    assert files
    for f in files:
        steps = [s.number for s in analyze_file(f).steps]  # analysing writes the index
        assert steps and any(p.endswith(step_index.SUFFIX) and os.path.exists(p)
                             for p, _ in cache.places(f, step_index.SUFFIX))
        trace = read_trace(f.path)
        for number in steps:
            indexed = msgspec.json.decode(step_index.step_trace(f, number))["traceEvents"]
            expected = full_read(f, number, trace)
            assert len(indexed) == len(expected)
            for a, b in zip(indexed, expected, strict=True):
                assert a == b
            device += sum(1 for e in indexed if e.get("cat") == "kernel")
        assert step_index.step_trace(f, max(steps) + 1000) is None  # no such step: said by the index
    return device


@pytest.mark.parametrize("folder", GPU_FOLDERS)
def test_the_indexed_cut_equals_the_full_read_on_the_gpu_traces(cached, traces, folder):
    run = cached / "logdir" / folder
    run.mkdir(parents=True)
    for f in traces.files("gpu", folder):
        shutil.copy(f, run / f.name)
    assert assert_index_equals_full_read(cached / "logdir") > 0


def test_the_indexed_cut_equals_the_full_read_on_built_traces(cached):
    root = cached / "logdir"
    evaluation_run(root / "eval")  # time kept out of steps, device work launched from it
    loop = Loop()
    for number in (1, 2, 3):  # ops nested in ranges, kernels on two streams, a launch through another call
        loop.step(number, ("## forward ##", 300, [("fwd", 40), ("fwd", 30, 9)], [("aten::linear", 10, 50)]),
                  ("## backward ##", 500, [("bwd", 80, 7, "cudaLaunchKernelExC", 3.0)]),
                  ("Optimizer.step#SGD.step", 100, [("Memcpy HtoD (Pageable -> Device)", 5)]))
    write_trace(root / "loop" / "worker.1.pt.trace.json.gz", loop.events)
    assert assert_index_equals_full_read(root) > 0


def indexed(cached):
    root = cached / "logdir"
    evaluation_run(root / "eval")
    (f,) = trace_files(root)
    analyze_file(f)
    (path, _), *_ = cache.places(f, step_index.SUFFIX)
    assert os.path.exists(path)
    return f, path


def test_an_index_of_a_trace_rewritten_since_is_not_used(cached):
    f, _ = indexed(cached)
    before = step_index.step_trace(f, 2)
    assert before is not None
    os.utime(f.path, ns=(f.mtime_ns + 10**9, f.mtime_ns + 10**9))  # the same bytes, but touched: another trace
    (changed,) = trace_files(cached / "logdir")
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(changed, 2)
    with pytest.raises(step_index.Unusable):  # the description it was made for no longer holds either
        step_index.step_trace(f, 2)


def test_an_index_made_for_another_trace_is_not_used(cached):
    f, path = indexed(cached)
    loop = Loop().step(1, ("## forward ##", 300, [("fwd", 40)])).step(2, ("## forward ##", 200, [("fwd", 30)]))
    other = write_trace(cached / "other" / "worker.1.pt.trace.json.gz", loop.events)
    (g,) = trace_files(cached / "other")
    analyze_file(g)
    (other_index, _), *_ = cache.places(g, step_index.SUFFIX)
    shutil.copy(other_index, path)  # another trace's index under this trace's name
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, 2)
    assert other.exists() and step_index.step_trace(g, 2) is not None


@pytest.mark.parametrize("where", ["magic", "header", "step", "truncated", "empty"])
def test_a_damaged_index_is_not_used_and_the_step_is_cut_from_the_trace(cached, where):
    f, path = indexed(cached)
    data = bytearray(Path(path).read_bytes())
    if where == "magic":
        data[0] ^= 1
    elif where == "header":
        data[len(step_index._HEAD) + 16 + 8 + 5] ^= 1
    elif where == "step":
        data[-20] ^= 1  # in the last step's deflated columns
    elif where == "truncated":
        data = data[:-100]
    else:
        data = bytearray()
    Path(path).write_bytes(bytes(data))
    number = 5 if where in ("step", "truncated") else 2  # the last step lies at the end of the file
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, number)
    store = TraceStore(os.path.dirname(os.path.dirname(f.path)))
    try:
        body = store.step_trace(f, number)  # cut from the trace by a worker process instead
        assert store._trace_pool is not None
    finally:
        store.close()
    assert msgspec.json.decode(body)["traceEvents"] == full_read(f, number)
    assert step_index.step_trace(f, number) == body  # and the index written again meanwhile


def test_a_step_replaced_by_another_valid_deflate_stream_of_its_length_is_not_used(cached):
    """Damage that deflate's own check cannot see (another valid stream, of another step's events, in
    the step's bytes): only the step's checksum tells, and the step is cut from the trace."""
    f, path = indexed(cached)
    data = bytearray(Path(path).read_bytes())
    at = len(step_index._HEAD) + step_index._CHECKSUM_BYTES
    (size,) = struct.unpack_from("<Q", data, at)
    header = step_index._header_decoder.decode(bytes(data[at + 8:at + 8 + size]))
    entry = header.steps[-1]
    begin = at + 8 + size + entry.offset
    cutter = StepCutter(read_trace(f.path))
    cut = cutter.cut(len(cutter.part.steps) - 1)
    # the same events a little later, deflated at some level until a stream of the same length
    forged = (zlib.compress(step_index._encoder.encode(msgspec.structs.replace(
        cut, host_ts=cut.host_ts + shift, dev_ts=cut.dev_ts + shift)), level)
        for shift in range(1, 200) for level in range(1, 10))
    blob = next((b for b in forged if len(b) == entry.length), None)
    assert blob is not None, "no forged stream of the step's length"
    data[begin:begin + entry.length] = blob
    Path(path).write_bytes(bytes(data))
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, entry.number)


def test_an_index_read_in_short_reads_is_read_whole(cached, monkeypatch):
    """A read may return fewer bytes than asked (a file on a network file system): the index asks
    again for the rest, and the step is the same. (The first line is read at most once: a short
    read there is an index not used.)"""
    f, _ = indexed(cached)
    whole = step_index.step_trace(f, 2)
    real = os.pread
    monkeypatch.setattr(step_index.os, "pread", lambda fd, n, offset: real(
        fd, n if n <= step_index._MAX_LINE else max(n // 3, 1), offset))
    assert step_index.step_trace(f, 2) == whole


def test_an_index_whose_columns_do_not_hold_together_is_not_used(cached):
    f, path = indexed(cached)
    cutter = StepCutter(read_trace(f.path))
    cut = cutter.cut(1)
    cut.host_name[0] = len(cutter.tables.names) + 5  # a name that is not in the table
    cutter.cut = lambda i, real=cutter.cut: cut if i == 1 else real(i)
    with open(path, "wb") as fh:  # checksums right: only the columns are wrong
        fh.write(step_index.encode(cache.Key(f.name, f.size, f.mtime_ns, cache.version()), cutter))
    assert step_index.step_trace(f, 1) is not None
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, 2)


def test_tensorboard_serves_any_step_from_the_index_without_decoding_the_trace(cached):
    root = settled_evaluation_logdir(cached)
    store = TraceStore(str(root))
    try:
        assert store.wait(120)
        (f,) = store.run("eval").files
        for number in (1, 2, 3, 4, 5):
            body = store.step_trace(f, number)
            assert msgspec.json.decode(body)["traceEvents"] == full_read(f, number)
        assert store.step_trace(f, 99) is None
        assert store._trace_pool is None  # no step needed the trace decoded again
    finally:
        store.close()


def test_without_the_cache_no_index_is_written_or_read(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "off")
    evaluation_run(tmp_path / "eval")
    (f,) = trace_files(tmp_path)
    analyze_file(f)
    assert not (tmp_path / "eval" / ".phaseprof").exists()
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, 2)


def test_a_trace_analysed_without_its_index_has_it_written_when_a_step_is_first_opened(cached):
    # TensorBoard's loaders leave the index out of a small trace while other files wait (`loading.load`)
    root = settled_evaluation_logdir(cached)
    (f,) = trace_files(root)
    analyze_file(f, index_from_events=10**9)
    assert cache.load(f) is not None  # the analysis is cached all the same
    with pytest.raises(step_index.Unusable):
        step_index.step_trace(f, 2)
    store = TraceStore(str(root))
    try:
        assert store.wait(120)
        assert msgspec.json.decode(store.step_trace(f, 2))["traceEvents"] == full_read(f, 2)
        assert store._trace_pool is not None  # cut from the trace
    finally:
        store.close()
    assert msgspec.json.decode(step_index.step_trace(f, 3))["traceEvents"] == full_read(f, 3)  # written meanwhile


@pytest.mark.parametrize("others_waiting", [True, False])
def test_a_loader_leaves_the_index_of_a_small_trace_for_later_only_while_other_files_wait(cached, others_waiting):
    evaluation_run(cached / "eval")
    (f,) = trace_files(cached)
    assert load((f, others_waiting)).steps
    written = [p for p, _ in cache.places(f, step_index.SUFFIX) if os.path.exists(p)]
    assert bool(written) is not others_waiting


# -- the index's format ---------------------------------------------------------------------------


class _NewerHeader(step_index.Header):
    """A header as a newer minor version might write it: a field this version does not know."""

    made_by: str = "phaseprof 9.9"


def _rewrite_index(f, path, line: bytes, header=step_index.Header) -> None:
    """Write ``f``'s index at ``path`` afresh, behind the first line ``line``, its header a
    ``header``."""
    key = cache.Key(f.name, f.size, f.mtime_ns, cache.version())
    data = step_index.encode(key, StepCutter(read_trace(f.path)))
    body = data[data.index(b"\n") + 1:]
    if header is not step_index.Header:  # the same steps, in a header with one more field
        size = int.from_bytes(body[16:24], "little")
        old = msgspec.msgpack.decode(body[24:24 + size], type=step_index.Header)
        new = msgspec.msgpack.encode(header(old.key, old.tables, old.steps))
        body = step_index._checksum(new) + len(new).to_bytes(8, "little") + new + body[24 + size:]
    Path(path).write_bytes(line + body)


@pytest.mark.parametrize("line", [b"phaseprof-step-index 1.4\n", b"phaseprof-step-index 1\n"],
                         ids=["newer minor, extra field", "no minor (1.0)"])
def test_an_index_of_a_newer_minor_version_or_of_none_is_used(cached, line):
    """A newer minor version's index (its extra header field ignored) serves steps; so does one
    written before formats had a minor version (``1``: format 1.0)."""
    f, path = indexed(cached)
    _rewrite_index(f, path, line, _NewerHeader)
    body = step_index.step_trace(f, 2)
    assert msgspec.json.decode(body)["traceEvents"] == full_read(f, 2)


def test_an_index_of_another_major_version_is_not_used_and_the_step_is_cut_from_the_trace(
        cached, caplog, monkeypatch):
    """An index a newer phaseprof made (format 2.0) is refused in one line of the log, and the step
    is cut from the trace instead: the same document, nothing fails."""
    from phaseprof import formats

    monkeypatch.setattr(formats, "_told", set())
    f, path = indexed(cached)
    _rewrite_index(f, path, b"phaseprof-step-index 2.0\n")
    with caplog.at_level("INFO", logger="phaseprof.plugin.step_index"):
        with pytest.raises(step_index.Unusable):
            step_index.step_trace(f, 2)
        with pytest.raises(step_index.Unusable):
            step_index.step_trace(f, 3)
    (line,) = [r.getMessage() for r in caplog.records if "format" in r.getMessage()]
    assert "format 2.0: this phaseprof reads format 1.x" in line and step_index.SUFFIX in line
    store = TraceStore(os.path.dirname(os.path.dirname(f.path)))
    try:
        body = store.step_trace(f, 2)
    finally:
        store.close()
    assert msgspec.json.decode(body)["traceEvents"] == full_read(f, 2)
    # written again, in this version's format
    assert Path(path).read_bytes().startswith(b"phaseprof-step-index 1.0\n")
