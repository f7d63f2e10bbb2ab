"""Hostile and unusual input, one test per kind: every file gives a result or one-line errors
naming it; nothing hangs, crashes or eats memory (docs/security.md)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time

import msgspec
import pytest

from phaseprof import analyze
from phaseprof.plugin.analysis.partition import _innermost
from phaseprof.plugin.reading import split
from phaseprof.plugin.reading.decode import read_trace
from phaseprof.plugin.reading.file_bytes import Limits, TraceError
from phaseprof.plugin.reading.trace_fields import Args
from phaseprof.plugin.serving.loading import LoaderPool
from tests.hostile import check_report, encode, exercise, training_trace, write
from tests.tracebuilder import PID, annotation, kernel, launch, op, step


def steps_of(report: dict) -> list[int]:
    return [s["step"] for s in only_worker(report)["steps"]]


def only_worker(report: dict) -> dict:
    (run,) = report["runs"]
    (worker,) = run["workers"]
    return worker


# --- empty and zero-length traces: clean empty results ---------------------------------------------

@pytest.mark.parametrize("content", [b'{"traceEvents": []}', b"[]", b"[{}]", b'{"traceEvents": [{}, {}]}'])
def test_an_empty_trace_is_an_empty_result_not_an_error(tmp_path, content):
    report = analyze(str(write(tmp_path / "w.1.pt.trace.json", content)))
    assert report["errors"] == []
    assert only_worker(report)["steps"] == []


def test_zero_length_steps_with_gpu_work_read_cleanly(tmp_path):
    events = [step(1, 10, 0), step(2, 10, 0), op("aten::mm", 10, 0), launch(10, 5, dur=0), kernel("k", 12, 3, 5)]
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    assert report["errors"] == []
    assert [s["wall_ms"] for s in only_worker(report)["steps"]] == [0.0, 0.0]


def test_steps_shorter_than_a_rounded_millisecond_give_findings_not_a_division_by_zero(tmp_path):
    # median step 0.1 µs (0.0 ms once rounded), one step 9x slower
    events = [step(i, 10.0 * i, 0.1) for i in range(1, 6)] + [step(6, 60, 0.9)]
    events += [op("aten::add", 10.0 * i + 0.01, 0.05) for i in range(1, 6)] + [op("aten::mul", 60.01, 0.8)]
    summary = only_worker(exercise(write(tmp_path / "w.1.pt.trace.json", encode(events))))["summary"]
    assert summary["median_wall_ms"] == 0.0
    # the slow step is told from the others, and why, however small the figures once rounded
    assert summary["slowest"]["step"] == 6 and summary["slowest"]["noise"] == "beyond-noise"
    assert summary["outliers"] == [6] and [o["name"] for o in summary["slowest"]["ops"]] == ["aten::mul"]
    (slow,) = [f for f in summary["findings"] if f["kind"] == "slow-step"]
    assert slow["text"].startswith("step 6 took") and "aten::mul" in slow["text"]


# --- values that decode but do not fit ---------------------------------------------------------------

@pytest.mark.parametrize("where", ["tid", "pid", "stream", "device", "correlation", "step"])
def test_integers_past_64_bits_degrade_one_field_not_the_file(tmp_path, where):
    huge = 2**64 + 3
    events = training_trace(2)
    if where == "step":
        events.append(annotation(f"ProfilerStep#{huge}", 5000, 10))
    else:
        target = next(e for e in events if e["cat"] == ("kernel" if where in ("stream", "device") else "cuda_runtime"))
        if where in ("tid", "pid"):
            target[where] = huge
        elif where == "device":
            target["pid"] = huge
        else:
            target["args"][where] = huge
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    steps = [s["step"] for s in only_worker(report)["steps"]]
    assert steps == [1, 2]  # a step number past 64 bits is no step marker
    if where in ("stream", "device", "correlation"):
        (error,) = report["errors"]
        assert "out of range" in error["error"]


def test_a_step_number_of_5000_digits_is_not_a_step_marker(tmp_path):
    events = training_trace(1) + [annotation("ProfilerStep#" + "7" * 5000, 5000, 10)]
    assert steps_of(exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))) == [1]


def test_step_numbers_are_ascii_digits_only(tmp_path):
    events = [step(1, 0, 10), annotation("ProfilerStep#\u0663", 20, 10), annotation("ProfilerStep#+7", 40, 10)]
    assert steps_of(exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))) == [1]


def test_a_kernel_on_a_stream_named_with_a_superscript_digit(tmp_path):
    events = training_trace(1)
    for e in events:
        if e["cat"] == "kernel":
            e["tid"] = "stream \u00b2"
            del e["args"]["stream"]
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    assert report["errors"] == []
    assert only_worker(report)["steps"][0]["phases"]["forward"]["gpu_ms"] > 0


def test_deep_nesting_inside_an_ignored_arg_reads(tmp_path):
    events = training_trace(1)
    events[3]["args"]["junk"] = "DEEP"
    deep = json.dumps({"traceEvents": events}).replace('"DEEP"', "[" * 1000 + "]" * 1000)
    report = exercise(write(tmp_path / "w.1.pt.trace.json", deep.encode()))
    assert report["errors"] == [] and only_worker(report)["steps"]


def test_nesting_deeper_than_the_reader_goes_is_one_clear_error(tmp_path, monkeypatch):
    from phaseprof.plugin.reading import decode

    monkeypatch.setattr(decode, "MAX_DEPTH", 2000)
    text = '{"traceEvents": [{"ph": "X", "args": {"x": ' + "[" * 5000 + "]" * 5000 + "}}]}"
    report = analyze(str(write(tmp_path / "w.1.pt.trace.json", text.encode())))
    (error,) = report["errors"]
    assert "nested more than 2,000 levels deep" in error["error"]


# --- per-event leniency ------------------------------------------------------------------------------

WRONG_TYPES = {
    "dur as text": ({"dur": "5"}, "1 event skipped: dur is not a number"),
    "ts as a list": ({"ts": [1]}, "ts is not a number"),
    "pid as a float": ({"pid": 1.5}, "pid is not a number or a string"),
    "name as a number": ({"name": 7}, "name is not a string"),
    "args as a list": ({"args": [1, 2]}, "args is not an object"),
    "correlation as text": ({"args": {"correlation": "seven"}}, "correlation is not a number"),
    "not an object": (None, "is not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_wrong_typed_field_skips_or_degrades_that_event_only(tmp_path, case):
    change, reason = WRONG_TYPES[case]
    events = training_trace(2)
    bad = events[3]  # aten::mm of step 1
    events[3] = 42 if change is None else {**bad, **change}
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    (error,) = report["errors"]
    assert reason in error["error"] and "event 3" in error["error"], error
    assert [s["step"] for s in only_worker(report)["steps"]] == [1, 2]


def test_a_well_formed_file_takes_the_typed_fast_path(tmp_path, monkeypatch):
    from phaseprof.plugin.reading import decode

    slow = []
    monkeypatch.setattr(decode, "decode_leniently", lambda *a: slow.append(1))
    read_trace(str(write(tmp_path / "w.1.pt.trace.json", encode(training_trace(3)))))
    assert not slow


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    for gz in (False, True):
        name = f"w{int(gz)}.1.pt.trace.json{'.gz' if gz else ''}"
        path = write(tmp_path / name, encode(training_trace(2), bom=True, gz=gz))
        report = analyze(str(path))
        assert report["errors"] == [] and len(only_worker(report)["steps"]) == 2


def test_json_errors_read_in_plain_words(tmp_path):
    report = analyze(str(write(tmp_path / "w.1.pt.trace.json", b'{"traceEvents": [{"ph": "X",, }]}')))
    (error,) = report["errors"]
    assert error["error"].startswith("not valid JSON (") and "jSON" not in error["error"]
    assert "JSON is malformed" not in error["error"]


def test_unpaired_surrogates_in_names_are_replaced_not_fatal(tmp_path):
    text = json.dumps({"traceEvents": training_trace(1)}).replace('"aten::mm"', '"aten::mm\\udcff"')
    report = exercise(write(tmp_path / "w.1.pt.trace.json", text.encode()))
    assert only_worker(report)["steps"] and "surrogates" in report["errors"][0]["error"]


def test_a_decode_error_in_a_split_plain_file_is_reported_not_masked(tmp_path, monkeypatch):
    # Decoding in two halves holds views of the memory-mapped file; the real error must come out.
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "fork_is_safe", lambda: True)
    text = json.dumps({"traceEvents": training_trace(200)})
    cut = text.index("}, {", len(text) // 2) + 1
    path = write(tmp_path / "w.1.pt.trace.json", (text[:cut] + ", @@" + text[cut:]).encode())
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(str(path))


# --- the schemas in the wild: ROCm, MTIA ---------------------------------------------------------------

def rocm_trace(steps: int = 3) -> list[dict]:
    """A trace as kineto writes it on AMD GPUs (ROCm 6.x, MI250): today's categories, HIP runtime
    calls, string-typed args on runtime and kernel events, the default stream 0."""
    events = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}}]
    corr = 100
    for n in range(1, steps + 1):
        t0 = 10_000.0 + 1000 * n
        events.append(step(n, t0, 900))
        for phase, start, work in (("## forward ##", 10, "Cijk_Ailk_Bljk_SB_MT64x64x16"),
                                   ("## backward ##", 300, "Cijk_Alik_Bljk_SB_MT64x64x16"),
                                   ("Optimizer.step#Adam.step", 600, "elementwise_kernel")):
            events.append(annotation(phase, t0 + start, 250))
            for k in range(3):
                corr += 1
                ts = t0 + start + 20 + 60 * k
                runtime = "hipExtModuleLaunchKernel" if k else "hipLaunchKernel"
                events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime,
                               "pid": PID, "tid": PID, "ts": ts, "dur": 8,
                               "args": {"cid": 11, "correlation": corr, "stream": "0x0", "grid": [64, 1, 1],
                                        "block": [256, 1, 1], "shared memory": 0, "kernel": work}})
                events.append({"ph": "X", "cat": "kernel", "name": work, "pid": 2, "tid": 0, "ts": ts + 12, "dur": 30,
                               "args": {"correlation": corr, "device": 2, "stream": "0x0", "kind": "0",
                                        "External id": corr}})
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "pid": PID, "tid": PID,
                           "ts": t0 + start + 200, "dur": 20,
                           "args": {"stream": "0x0", "cid": 54, "correlation": corr, "src": "0x7f3a5c000000",
                                    "dst": "0x7f3a5d000000", "size": "2560", "kind": "1"}})
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 2, "tid": 0,
                           "ts": t0 + start + 205, "dur": 5,
                           "args": {"correlation": corr, "device": 2, "stream": "0x7f3a5c000f00", "size": "2560",
                                    "kind": "1"}})
    return events


def test_a_rocm_trace_reads_with_steps_and_device_time_per_phase(tmp_path, monkeypatch):
    from phaseprof.plugin.reading import decode

    slow = []
    real = decode.decode_leniently
    monkeypatch.setattr(decode, "decode_leniently", lambda *a: slow.append(1) or real(*a))
    data = encode(rocm_trace(), gz=True, deviceProperties=[{"name": "AMD Instinct MI250X"}])
    report = exercise(write(tmp_path / "mi250.1.pt.trace.json.gz", data))
    assert report["errors"] == [] and not slow  # typed fast path, nothing skipped
    worker = only_worker(report)
    assert worker["gpu"] and worker["gpu_names"] == []  # deviceProperties index 0, the kernels ran on device 2
    assert [s["step"] for s in worker["steps"]] == [1, 2, 3]
    for row in worker["steps"]:
        for phase in ("forward", "backward", "optimizer"):
            assert row["phases"][phase]["gpu_ms"] == pytest.approx(0.095, abs=1e-3), (row["step"], phase)


def test_mtia_and_other_device_kinds_stay_readable(tmp_path):
    events = [step(1, 0, 100), annotation("## forward ##", 5, 50),
              {"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunchKernel", "pid": PID, "tid": PID, "ts": 10, "dur": 2,
               "args": {"correlation": 9}},
              {"ph": "X", "cat": "mtia_ccp_events", "name": "fused_kernel", "pid": 1, "tid": 3, "ts": 20, "dur": 20,
               "args": {"correlation": 9}},
              {"ph": "X", "cat": "some_future_device_kind", "name": "x", "pid": 1, "tid": 3, "ts": 20, "dur": 20}]
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    assert report["errors"] == []
    assert only_worker(report)["steps"][0]["phases"]["forward"]["gpu_ms"] == pytest.approx(0.02)


# --- files: only regular ones, bounded size and time -----------------------------------------------------

def test_a_fifo_named_like_a_trace_is_reported_without_blocking(tmp_path):
    write(tmp_path / "good.1.pt.trace.json", encode(training_trace(1)))
    os.mkfifo(tmp_path / "fifo.1.pt.trace.json")
    os.mkfifo(tmp_path / "sniffed.json")  # a JSON name that is sniffed for trace keys
    result = []
    worker = threading.Thread(target=lambda: result.append(analyze(str(tmp_path))), daemon=True)
    worker.start()
    worker.join(300)
    assert result, "reading a logdir holding a FIFO blocked"
    (error,) = result[0]["errors"]
    assert os.path.basename(error["path"]) == "fifo.1.pt.trace.json"
    assert error["error"] == "not a regular file (a FIFO); only regular files are read"
    assert [w["worker"] for r in result[0]["runs"] for w in r["workers"]] == ["good"]


def gzip_bomb(mib: int) -> bytes:
    """A gzip file inflating to ``mib`` MiB of a trace's opening and spaces: about 1 KB per MiB
    (one member per MiB)."""
    spaces = gzip.compress(b" " * (1 << 20), 9)
    return gzip.compress(b'{"traceEvents": [', 9) + spaces * mib


def test_a_gzip_bomb_stops_at_the_inflate_budget(tmp_path):
    path = write(tmp_path / "bomb.1.pt.trace.json.gz", gzip_bomb(1024))
    assert path.stat().st_size < 2 << 20
    report = analyze(str(path))
    (error,) = report["errors"]
    budget = Limits().inflate_budget(path.stat().st_size)
    assert budget < 128 << 20
    assert error["error"].startswith("inflates past ") and "gzip bomb" in error["error"]


def test_budgets_are_configurable(tmp_path, monkeypatch):
    good = write(tmp_path / "w.1.pt.trace.json.gz", encode(training_trace(50), gz=True))
    inflated = len(gzip.decompress(good.read_bytes()))
    tight = Limits(min_budget=0, max_ratio=2)
    with pytest.raises(TraceError, match="inflates past"):
        read_trace(str(good), limits=tight)
    monkeypatch.setenv("PHASEPROF_MAX_TRACE_BYTES", str(inflated - 1))
    assert "inflates past" in analyze(str(good))["errors"][0]["error"]
    monkeypatch.delenv("PHASEPROF_MAX_TRACE_BYTES")
    monkeypatch.setenv("PHASEPROF_MAX_READ_SECONDS", "1e-9")
    assert "took too long" in analyze(str(good))["errors"][0]["error"]
    monkeypatch.setenv("PHASEPROF_MAX_READ_SECONDS", "not a number")  # ignored: the default holds
    assert analyze(str(good))["errors"] == []


# --- names from the file system that are not UTF-8 -----------------------------------------------------------

def test_a_file_name_that_is_not_utf8_is_shown_escaped(tmp_path):
    root = os.fsencode(tmp_path)
    os.makedirs(root + b"/run\xff")
    write(os.fsdecode(root + b"/run\xff/w\xfe.1.pt.trace.json"), encode(training_trace(1)))
    write(os.fsdecode(root + b"/run\xff/bad\xfd.1.pt.trace.json"), b"{")
    report = analyze(str(tmp_path))
    check_report(report)
    (run,) = report["runs"]
    assert run["run"] == "run\\xff" and run["workers"][0]["worker"] == "w\\xfe"
    assert report["errors"][0]["path"].endswith("run\\xff/bad\\xfd.1.pt.trace.json")
    out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", "--json", str(tmp_path)],
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert msgspec.json.decode(out.stdout)["runs"][0]["run"] == "run\\xff"


# --- the loader pool -----------------------------------------------------------------------------------------

def _hang(f):
    if "hang" in f:
        time.sleep(3600)
    if "die" in f:
        os._exit(3)
    return f"loaded {f}"


def test_a_file_that_hangs_or_kills_its_loader_fails_alone(tmp_path):
    done: dict[str, tuple] = {}
    finished = threading.Event()

    def record(key, state, result):
        done[key] = (state, result)
        if len(done) == 5:
            finished.set()

    # a file's time counts from when its worker begins it: a worker's start-up (an interpreter importing
    # numpy and the plugin, however long a busy machine makes it) is not the file's
    pool = LoaderPool(record, 2, target=_hang, timeout_s=10)
    try:
        for name in ("hang", "die", "a", "b", "c"):
            pool.submit(name, name)
        assert finished.wait(300), done
    finally:
        pool.close()
    assert done["a"] == ("ready", "loaded a") and done["c"] == ("ready", "loaded c")
    assert done["hang"][0] == "error" and "longer than 10 s" in done["hang"][1]
    assert done["die"][0] == "error" and "exited (3)" in done["die"][1] and "replaced" in done["die"][1]


def test_a_loading_process_slow_to_start_does_not_spend_the_files_time():
    """The file's time starts when its worker begins it: a worker three seconds into starting (its
    target's module sleeps on import) still loads a file whose limit is one second."""
    from tests.slow_start import quick

    done = {}
    finished = threading.Event()

    def record(key, state, result):
        done[key] = (state, result)
        finished.set()

    pool = LoaderPool(record, 1, target=quick, timeout_s=1)
    try:
        pool.submit("a", "a")
        assert finished.wait(300), done
    finally:
        pool.close()
    assert done == {"a": ("ready", "loaded a")}


def _may_split(f):
    from phaseprof.plugin.reading import split

    return split.fork_is_safe()


def test_a_loader_process_may_decode_a_large_file_on_two_cores():
    """Nothing the pool starts in its workers (a parent watch) keeps a large file from the two-process split."""
    result = {}
    finished = threading.Event()

    def record(key, state, value):
        result[key] = (state, value)
        finished.set()

    pool = LoaderPool(record, 1, target=_may_split)
    try:
        pool.submit("big", "big")
        assert finished.wait(300), result
    finally:
        pool.close()
    assert result["big"] == ("ready", True)


# --- the phase partition -------------------------------------------------------------------------------------

def test_the_phase_partition_of_many_ranges_is_the_innermost_range_everywhere():
    import random

    rng = random.Random(7)
    for _ in range(300):
        ranges = []
        for _ in range(rng.randint(0, 15)):
            s = float(rng.randint(0, 100))
            ranges.append((s, min(100.0, s + rng.choice([0, 1, 5, 20, 60]) + rng.random()), rng.randint(0, 6),
                           rng.randint(0, 1)))
        segments = _innermost(0.0, 100.0, ranges, 4)
        assert segments[0][0] == 0.0 and segments[-1][1] == 100.0
        for (s, e, p), nxt in zip(segments, segments[1:] + [None]):
            assert nxt is None or nxt[0] == e  # no gaps
            mid = (s + e) / 2  # innermost by brute force: the best covering range at the middle
            covering = [(t, rs, -re, -i, ph) for i, (rs, re, ph, t) in enumerate(ranges) if rs <= mid < re]
            assert p == (max(covering)[4] if covering else 4)


# --- routes: never a 500 for a bad file ---------------------------------------------------------------------

def test_no_route_answers_500_for_hostile_files(tmp_path):
    from urllib.parse import quote

    from tests.test_plugin import make_app

    files = {
        "empty/w.1.pt.trace.json": b'{"traceEvents": []}',
        "zero/w.1.pt.trace.json": encode([step(1, 10, 0), step(2, 10, 0), launch(10, 5, dur=0), kernel("k", 12, 3, 5)]),
        "tiny/w.1.pt.trace.json": encode([step(i, 10.0 * i, 0.1) for i in range(1, 6)] + [step(6, 60, 0.9)]),
        "typed/w.1.pt.trace.json": encode(training_trace(2)[:3] + [{"ph": "X", "dur": "5"}, 42]
                                          + training_trace(2)[3:]),
        "huge/w.1.pt.trace.json": encode(training_trace(2) + [{**op("aten::mm", 1010, 1), "tid": 2**64},
                                                               annotation(f"ProfilerStep#{2**70}", 1500, 5)]),
        "rocm/w.1.pt.trace.json.gz": encode(rocm_trace(2), gz=True),
        "broken/w.1.pt.trace.json": b'{"traceEvents": [{',
    }
    for name, data in files.items():
        write(tmp_path / name, data)
    write(tmp_path / "odd" / "w\t.1.pt.trace.json", encode(training_trace(2)))  # (not UTF-8: the real TensorBoard test)
    os.mkfifo(tmp_path / "zero" / "fifo.2.pt.trace.json")
    for root, _, names in os.walk(tmp_path):
        for n in names:
            os.utime(os.path.join(root, n), (time.time() - 60, time.time() - 60))
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        runs = client.get("/data/plugin/phaseprof/runs")
        assert runs.status_code == 200
        listing = json.loads(runs.get_data())
        names = [r["run"] for r in listing["runs"]]
        assert "odd" in names and any(w["worker"] == "w\\t" for r in listing["runs"] for w in r["workers"])
        urls = []
        for run in listing["runs"]:
            r = quote(run["run"])
            for worker in run["workers"]:
                w = quote(worker["worker"])
                urls += [f"steps?run={r}&worker={w}", f"ranks?run={r}", f"timeline?run={r}",
                         f"compare?run_a={r}&worker_a={w}&run_b=zero&step_b=1"]
                steps = json.loads(client.get(f"/data/plugin/phaseprof/steps?run={r}&worker={w}").get_data())
                for s in steps["steps"]:
                    urls += [f"step?run={r}&worker={w}&step={s['step']}",
                             f"compare?run_a={r}&worker_a={w}&step_a={s['step']}&run_b={r}&worker_b={w}"]
        for url in urls:
            response = client.get("/data/plugin/phaseprof/" + url)
            assert response.status_code in (200, 400, 404), (url, response.status_code, response.get_data()[:500])
    finally:
        plugin._store.close()


def test_a_fifo_in_place_of_a_cached_analysis_does_not_block(tmp_path):
    from phaseprof.contract import ANALYSIS_DIR

    write(tmp_path / "w.1.pt.trace.json", encode(training_trace(1)))
    os.makedirs(tmp_path / ANALYSIS_DIR)
    os.mkfifo(tmp_path / ANALYSIS_DIR / "w.1.pt.trace.json.analysis")
    result = []
    reader = threading.Thread(target=lambda: result.append(analyze(str(tmp_path))), daemon=True)
    reader.start()
    reader.join(300)
    assert result, "a FIFO where a cached analysis would be blocked the reader"
    assert result[0]["errors"] == [] and steps_of(result[0]) == [1]


def test_the_analysis_cache_is_never_written_through_a_link_out_of_the_logdir(tmp_path, monkeypatch):
    from phaseprof.contract import ANALYSIS_DIR

    monkeypatch.setenv("PHASEPROF_CACHE", str(tmp_path / "user-cache"))
    logdir, outside = tmp_path / "logdir", tmp_path / "outside"
    outside.mkdir()
    write(logdir / "w.1.pt.trace.json", encode(training_trace(1)))
    os.symlink(outside, logdir / ANALYSIS_DIR)
    assert steps_of(analyze(str(logdir))) == [1]
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert list((tmp_path / "user-cache").rglob("*.analysis"))  # the user's cache took the entry


# --- the same output whatever the string hash seed ----------------------------------------------------------

def test_the_report_is_the_same_for_every_string_hash_seed(tmp_path):
    """Ties everywhere (user phases of equal time, ops of equal self time, steps of equal wall time):
    the report must not depend on the order Python happens to iterate a set of names in."""
    from tests.tracebuilder import Loop

    loop = Loop()
    names = [f"aten::op_{c}" for c in "abcdefghijklmnop"]
    ops = [(name, 1 + 5 * i, 3) for i, name in enumerate(names)]
    for n in range(1, 9):
        loop.step(n, ("phaseprof::alpha", 100, [("k_" + c, 20) for c in "abcd"], ops),
                  ("phaseprof::beta", 100, [("k_" + c, 20) for c in "efgh"], ops), ("phaseprof::gamma", 100, [], ops))
    write(tmp_path / "run" / "w.1.pt.trace.json", encode(loop.events))
    outputs = set()
    for seed in range(4):
        out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", "--json", "--step", "3", str(tmp_path)],
                             capture_output=True, timeout=600,
                             env={**os.environ, "PYTHONHASHSEED": str(seed), "PHASEPROF_CACHE": "off"})
        assert out.returncode == 0, out.stderr.decode()
        outputs.add(out.stdout)
    assert len(outputs) == 1
    (worker,) = msgspec.json.decode(outputs.pop())["runs"][0]["workers"]
    assert worker["summary"]["phases"][-3:] == ["alpha", "beta", "gamma"]  # user phases as the trace has them


def test_step_numbers_far_apart_list_the_steps_of_every_op(tmp_path):
    """Step numbers more than 2**32 apart in one span (a hostile trace, or a forged cached analysis):
    /ops lists each op's steps (it answered 500 before)."""
    from phaseprof.plugin.analysis.operators import run_ops
    from phaseprof.plugin.analysis.span import analyze_trace
    from phaseprof.plugin.analysis.worker import Worker
    from tests.hostile import training_step

    events = training_step(1, 1000, 1) + training_step(2**40, 1100, 11) + training_step(2**40 + 7, 1200, 21)
    path = write(tmp_path / "w.1.pt.trace.json", encode(events))
    w = Worker("w", [analyze_trace(read_trace(str(path)))])
    assert w.numbers == [1, 2**40, 2**40 + 7]
    for group in ("name", "shapes"):
        rows = {r.name: r.steps for r in run_ops(w, None, group).ops}
        assert rows["aten::mm"] == [1, 2**40, 2**40 + 7], group


# --- directories that cannot be listed -------------------------------------------------------------------

def _unlistable(monkeypatch, name: str) -> None:
    """Listing any directory called ``name`` fails as it does without permission (tests run as root,
    whom ``chmod 000`` does not stop)."""
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fsdecode(path)) == name:
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_directory_that_cannot_be_listed_is_an_error_entry(tmp_path, monkeypatch):
    from tests.test_plugin import make_app

    write(tmp_path / "good" / "w.1.pt.trace.json", encode(training_trace(2)))
    write(tmp_path / "locked" / "w.1.pt.trace.json", encode(training_trace(2)))
    for root, _, names in os.walk(tmp_path):
        for n in names:
            os.utime(os.path.join(root, n), (time.time() - 60, time.time() - 60))
    _unlistable(monkeypatch, "locked")
    report = analyze(str(tmp_path))
    assert [r["run"] for r in report["runs"]] == ["good"] and steps_of(report) == [1, 2]
    (error,) = report["errors"]
    assert error == {"path": os.path.join(str(tmp_path), "locked"),
                     "error": "cannot read the directory (Permission denied)"}
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        listing = json.loads(client.get("/data/plugin/phaseprof/runs").get_data())
        assert listing["errors"] == [{"path": "locked", "error": "cannot read the directory (Permission denied)"}]
        assert [r["run"] for r in listing["runs"]] == ["good"]
    finally:
        plugin._store.close()
    from phaseprof.cli.compare import _Side

    assert [e.error for e in _Side(str(tmp_path)).errors] == ["cannot read the directory (Permission denied)"]


def report_as_nobody(path: str) -> tuple[int, bytes]:
    """``phaseprof report --json PATH`` (exit status, output), run as a user without root's
    privileges: in a child forked from this process, which drops to ``nobody`` (65534) when run as
    root, so the run needs no file of the clone or its virtual environment to be readable by that
    user (a clone under a root's home, mode 700). Every module the report imports is loaded
    beforehand, by running it here first."""
    import contextlib
    import io

    from phaseprof.cli import main

    with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO(), encoding="utf-8")):
        main(["report", "--json", path])  # as this user, who reads everything: imports are done
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome is its exit status and output
        code = 70
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            os.dup2(write, 1)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - this process ends below
            code = main(["report", "--json", path])
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - the parent reads the status and the output
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        out = fh.read()
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="reads as another user in a forked child")
def test_a_directory_without_permission_is_an_error_entry_for_a_user_who_lacks_it(tmp_path):
    """The same with a real ``chmod 000``, read by a user without root's privileges."""
    import shutil
    import tempfile

    logdir = tempfile.mkdtemp(prefix="phaseprof-locked-")  # where another user may look
    try:
        os.chmod(logdir, 0o755)
        for run in ("good", "locked"):
            path = write(os.path.join(logdir, run, "w.1.pt.trace.json"), encode(training_trace(2)))
            os.chmod(path.parent, 0o755)
            os.chmod(path, 0o644)
        os.chmod(os.path.join(logdir, "locked"), 0)
        code, out = report_as_nobody(logdir)
        assert code == 0, out
        report = msgspec.json.decode(out)
        assert [r["run"] for r in report["runs"]] == ["good"]
        assert report["errors"] == [{"path": os.path.join(logdir, "locked"),
                                     "error": "cannot read the directory (Permission denied)"}]
    finally:
        os.chmod(os.path.join(logdir, "locked"), 0o755)
        shutil.rmtree(logdir)


@pytest.mark.parametrize("name", [f.encode_name for f in msgspec.structs.fields(Args)])
def test_every_arg_of_the_wrong_type_degrades_that_arg_only(tmp_path, name):
    """Each field the reader takes from ``args`` (`trace_fields.Args`; the event-by-event pass derives
    its own from it), given a list: the file reads, that event keeps its other fields, and a number
    that is not one is named."""
    from phaseprof.plugin.reading import lenient

    field = next(f for f in msgspec.structs.fields(Args) if f.encode_name == name)
    events = training_trace(2)
    target = next(i for i, e in enumerate(events) if e["cat"] == "kernel")
    events[target]["args"][name] = [1, 2]
    report = exercise(write(tmp_path / "w.1.pt.trace.json", encode(events)))
    assert steps_of(report) == [1, 2]
    numeric = field.type in (int, float) or field.type == (int | str)
    if numeric:
        (error,) = report["errors"]
        said = lenient._SAID.get(field.name, name if field.type is float else field.name.replace("_", " "))
        assert f"{said} is not a number" in error["error"] and f"event {target}" in error["error"], error
    elif name in ("grid", "block"):  # raw JSON parsed where the kernel's launch is read
        (error,) = report["errors"]
        assert f"{name} is not [x, y, z]" in error["error"] and f"event {target}" in error["error"], error
    else:
        assert report["errors"] == []
    if name != "correlation":  # the kernel is still attributed by its correlation
        assert only_worker(report)["steps"][0]["phases"]["forward"]["gpu_ms"] > 0
