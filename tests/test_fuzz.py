"""Property-based fuzzing of the reader and the analysis with hostile traces (hypothesis).

Traces are generated structurally: Kineto-like events whose fields are sometimes of the wrong type,
out of range, missing, unicode or deeply nested; step markers, phase ranges and correlations that
overlap, repeat or point nowhere; files wrapped in odd ways (bare lists, BOMs, gzip) and corrupted
byte by byte. Every case must give a result or one-line errors naming the file: no exception, no
"internal error", a report that encodes as JSON.

The normal run uses a fixed seed and a few hundred cases. The thorough run (docs/security.md)::

    PHASEPROF_FUZZ=thorough python -m pytest -m fuzz -p no:cacheprovider

runs thousands and prints how many cases ran, the slowest and the peak memory.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import resource
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile import HOSTILE_NAMES, encode, exercise, exercise_entry, training_trace
from tests.tracebuilder import annotation, step

THOROUGH = os.environ.get("PHASEPROF_FUZZ") == "thorough"
# thousands of cases take longer than the suite's timeout for one test; the run prints its slowest case
pytestmark = [pytest.mark.fuzz, *([pytest.mark.timeout(0)] if THOROUGH else [])]

settings.register_profile("default", max_examples=100, derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("thorough", max_examples=2000, derandomize=False, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.load_profile("thorough" if THOROUGH else "default")

#: Per-case time and the process's peak memory, printed at the end of a thorough run.
STATS = {"cases": 0, "slowest_s": 0.0}

NAMES = [
    "aten::mm", "aten::add_", "aten::ones_like", "autograd::engine::evaluate_function: MmBackward0",
    "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#0", "ProfilerStep#18446744073709551616",
    "ProfilerStep#" + "9" * 40, "ProfilerStep#\u0663", "## forward ##", "## backward ##", "## optimizer ##",
    "Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "phaseprof::forward", "phaseprof::backward",
    "phaseprof::eval", "phaseprof::paused", "phaseprof::compile", "phaseprof::", "phaseprof::\u202etxt",
    "[pl][profile]run_training_batch", "[memory]", "cudaLaunchKernel", "hipLaunchKernel", "cudaMemcpyAsync", "",
    " ", "thread_name", "process_name", "stream \u00b2", "\x00", "\ud83d\ude00", *HOSTILE_NAMES,
]
CATEGORIES = ["cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset",
              "cpu_instant_event", "Operator", "Runtime", "Kernel", "Memcpy", "", "python_function",
              "gpu_user_annotation", "ac2g", "mtia_runtime", "mtia_ccp_events", "xpu_runtime", "overhead"]

HUGE = [2**63, 2**64 + 1, -(2**63) - 1, 10**40, 2**31, -1, 0]


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def hostile_values() -> st.SearchStrategy:
    return st.one_of(
        st.none(), st.booleans(), st.sampled_from(HUGE), st.integers(-10, 10**6),
        st.floats(allow_nan=False, allow_infinity=False), st.floats(min_value=-1e20, max_value=1e20),
        st.text(max_size=8), st.sampled_from(["0x0", "0x7f3a5c000000", "2560", "stream 7", "NaN", "1e400", "-5"]),
        st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        st.sampled_from([f"@DEEP{d}@" for d in (50, 1200, 3000)]),
    )


@st.composite
def events(draw) -> dict:
    """One Kineto-like event, sometimes with a field replaced by a hostile value or removed."""
    cat = draw(st.sampled_from(CATEGORIES))
    event = {
        "ph": draw(st.sampled_from(["X"] * 8 + ["i", "M", "B", "E", "f", "s", "Q", "", "XX"])),
        "cat": cat,
        "name": draw(st.sampled_from(NAMES) | st.text(max_size=12)),
        "pid": draw(st.sampled_from([100, 100, 0, 1, 2, "CPU functions", "100"])),
        "tid": draw(st.sampled_from([100, 100, 101, 7, "stream 7", "7", "stream \u00b2"])),
        "ts": draw(st.floats(0, 1000, allow_nan=False) | st.integers(0, 1000)),
        "dur": draw(st.sampled_from([0, 0.0001, 1, 10, 100, 1000]) | st.floats(0, 500, allow_nan=False)),
        "args": {},
    }
    args = event["args"]
    if draw(st.booleans()):
        args["correlation"] = draw(st.integers(0, 12))
    if draw(st.booleans()) and cat in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel"):
        args["stream"] = draw(st.sampled_from([7, 0, "0x0", "7"]))
    if event["name"] == "[memory]" or draw(st.integers(0, 9)) == 0:
        args.update({"Bytes": draw(st.integers(-4096, 4096)), "Total Allocated": draw(st.integers(0, 10**6)),
                     "Device Type": draw(st.sampled_from([0, 1, 20])), "Device Id": draw(st.sampled_from([-1, 0, 1]))})
    if draw(st.integers(0, 4)) == 0:
        args["Input Dims"] = draw(st.sampled_from([[[2, 3]], [], "[[1]]", [[None]]]))
    for _ in range(draw(st.integers(0, 2))):  # hostile fields
        key = draw(st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "args.correlation",
                                    "args.stream", "args.Bytes", "args.Device Type", "args.Device Id",
                                    "args.Total Allocated", "args.name", "args.junk"]))
        value = draw(hostile_values())
        if draw(st.integers(0, 4)) == 0:
            (args if key.startswith("args.") else event).pop(key.removeprefix("args."), None)
        elif key.startswith("args."):
            args[key[5:]] = value
        else:
            event[key] = value
    return event


@st.composite
def traces(draw) -> bytes:
    """A whole file: a plausible training trace with hostile events mixed in, in one of the
    layouts traces come in, sometimes corrupted byte by byte."""
    base = training_trace(draw(st.integers(0, 3)))
    if draw(st.booleans()):  # names the terminal must show as text: an op, a kernel, a phase of the user's
        for e in base:
            if e["name"] in ("aten::mm", "gemm", "Optimizer.step#SGD.step"):
                e["name"] = draw(st.sampled_from(HOSTILE_NAMES))
        if base:
            base.append(annotation("phaseprof::" + draw(st.sampled_from(HOSTILE_NAMES)), 1090, 5))
    extra = draw(st.lists(events(), max_size=25))
    if draw(st.integers(0, 5)) == 0:  # a loop that ended early many times over: hundreds of empty steps
        extra += [step(n, 5_000.0 + n, 0) for n in range(10, 10 + draw(st.integers(1, 400)))]
    mixed = base + extra
    order = draw(st.permutations(range(len(mixed)))) if draw(st.booleans()) else range(len(mixed))
    evs = [mixed[i] for i in order]
    if draw(st.integers(0, 9)) == 0:
        evs = draw(st.sampled_from([[], [{}], [1, "x", None], [[]]])) + evs
    layout = draw(st.sampled_from(["object", "object", "list", "extras"]))
    if layout == "extras":
        text = json.dumps({"traceEvents": evs, "distributedInfo": draw(hostile_values()),
                           "deviceProperties": draw(st.sampled_from([[{"name": "GPU"}], "x", [1], None]))})
    else:
        text = json.dumps({"traceEvents": evs} if layout == "object" else evs,
                          ensure_ascii=draw(st.booleans()))
    for d in (50, 1200, 3000):
        text = text.replace(f'"@DEEP{d}@"', deep(d))
    data = text.encode("utf-8", "surrogatepass")
    corruption = draw(st.sampled_from(["none"] * 6 + ["truncate", "flip", "insert", "bom", "nul"]))
    if data and corruption != "none":
        at = draw(st.integers(0, len(data) - 1))
        if corruption == "truncate":
            data = data[:at]
        elif corruption == "flip":
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        elif corruption == "insert":
            junk = draw(st.sampled_from([b"{", b"]", b",", b'"', b"\\", b"\xff", b"\xed\xa0\x80"]))
            data = data[:at] + junk + data[at:]
        elif corruption == "bom":
            data = b"\xef\xbb\xbf" + data
        else:
            data = data[:at] + b"\x00" + data[at:]
    if draw(st.integers(0, 3)) == 0:
        data = gzip.compress(data, 1)
        if draw(st.integers(0, 3)) == 0:  # a damaged gzip member
            data = data[: draw(st.integers(0, len(data)))]
    return data


def _run_case(data: bytes, suffix: str = ".1.pt.trace.json") -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fuzz" + suffix + (".gz" if data[:2] == b"\x1f\x8b" else ""))
        with open(path, "wb") as fh:
            fh.write(data)
        start = time.monotonic()
        exercise(path)  # a case that hangs fails on pytest-timeout, with its traceback
        took = time.monotonic() - start
    STATS["cases"] += 1
    STATS["slowest_s"] = max(STATS["slowest_s"], took)


@given(traces())
def test_hostile_traces_read_cleanly(data):
    _run_case(data)


@given(st.lists(events(), max_size=60), st.booleans())
def test_hostile_event_lists_read_cleanly(evs, bare):
    text = json.dumps(evs if bare else {"traceEvents": evs})
    for d in (50, 1200, 3000):
        text = text.replace(f'"@DEEP{d}@"', deep(d))
    _run_case(text.encode("utf-8", "surrogatepass"))


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 100), st.floats(0, 60), st.sampled_from(NAMES[8:23])),
                max_size=40),
       st.lists(st.tuples(st.integers(1, 3), st.floats(0, 100), st.floats(0, 60)), max_size=4))
def test_step_and_phase_games_keep_host_time_whole(ranges, steps):
    """Steps that overlap, repeat or are empty, and phase ranges and time kept out of the steps
    (evaluation, paused) across them: every step's host phases still add up to its wall time, and
    what was kept out of it is never negative."""
    from tests.tracebuilder import annotation, op

    evs = [step(n, s, d) for n, s, d in steps]
    evs += [annotation(name, s, d, tid=100 + t % 2) for t, s, d, name in ranges]
    evs += [op("aten::mm", s + 0.5, d / 2) for _, s, d, _ in ranges[:5]]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.1.pt.trace.json")
        with open(path, "wb") as fh:
            fh.write(encode(evs))
        start = time.monotonic()
        report = exercise(path)
        STATS["cases"] += 1
        STATS["slowest_s"] = max(STATS["slowest_s"], time.monotonic() - start)
    for run in report["runs"]:
        for worker in run["workers"]:
            for row in worker["steps"]:
                total = sum(p["host_ms"] for p in row["phases"].values())
                assert total == pytest.approx(row["wall_ms"], abs=0.002 * max(1, len(row["phases"])))
                assert row["eval_ms"] >= 0 and row["paused_ms"] >= 0


@functools.cache
def _entry_bytes() -> bytes:
    """A cached analysis as written to disk: a training loop with GPU work, memory and a user phase."""
    from phaseprof.plugin import cache
    from phaseprof.plugin.analysis.span import analyze_trace
    from phaseprof.plugin.reading.decode import read_trace
    from tests.tracebuilder import annotation

    events = training_trace(5) + [annotation("phaseprof::loss", 1090.0 + 100 * i, 5) for i in range(5)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.1.pt.trace.json")
        with open(path, "wb") as fh:
            fh.write(encode(events))
        analysis = analyze_trace(read_trace(path))
    return cache._encode(cache.Entry(cache.Key("w.1.pt.trace.json", 1, 1, "v"), analysis))


FORGED_VALUES = [0, -1, 1, 2**31, -(2**31), 2**62, float("nan"), float("inf"), -float("inf"), 1e300, -1e-300]


@given(st.lists(st.tuples(st.sampled_from(["grid", "table", "step", "rank"]), st.integers(0, 63), st.integers(0, 63),
                          st.integers(0, 10**6), st.sampled_from(FORGED_VALUES)), min_size=1, max_size=6))
def test_forged_cache_entries_never_fail_a_reader(edits):
    """An entry of valid bytes (the checksum matches) whose figures were changed by someone who can
    write the logdir: either `cache.consistent` refuses it, or every reader answers, with figures
    that may be wrong, but never fails."""
    from phaseprof.plugin import cache

    analysis = cache._decode(_entry_bytes()).analysis
    for where, which, column, at, value in edits:
        if where == "grid":
            names = [f for f in analysis.__struct_fields__ if isinstance(getattr(analysis, f), np.ndarray)]
            _forge_array(analysis, names[which % len(names)], at, value)
        elif where == "table":
            table = getattr(analysis, ("ops", "kernels", "memory_curve", "lanes", "apart", "gpu")[which % 6])
            columns = [f for f in table.__struct_fields__ if isinstance(getattr(table, f), np.ndarray)]
            _forge_array(table, columns[column % len(columns)], at, value)
        elif where == "step":
            forged = analysis.steps[at % len(analysis.steps)]
            field = ("number", "start", "end", "events")[which % 4]
            if field in ("start", "end"):
                setattr(forged, field, float(value))
            elif np.isfinite(value):  # an entry holds 64-bit integers (msgpack's)
                setattr(forged, field, int(np.clip(value, -(2**62), 2**62)))
        elif np.isfinite(value):
            analysis.rank, analysis.world_size = int(np.clip(value, -(2**62), 2**62)), which
        else:
            analysis.rank = analysis.world_size = None
    if cache.consistent(analysis):
        exercise_entry(analysis)


def _forge_array(owner, field: str, at: int, value: float) -> None:
    """Set one element of ``owner.field`` to ``value`` (cast to an integer array's type, saturating)."""
    array = getattr(owner, field).copy()
    if not array.size:
        return
    if array.dtype.kind == "f":
        array.flat[at % array.size] = value
    elif array.dtype.kind == "b":  # a flag per row (a step cut by the trace's end, say): flipped
        array.flat[at % array.size] = not array.flat[at % array.size]
    elif np.isfinite(value):
        info = np.iinfo(array.dtype)
        array.flat[at % array.size] = min(max(int(value), info.min), info.max)
    setattr(owner, field, array)


def teardown_module(module):
    if THOROUGH:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"\nfuzz: {STATS['cases']} cases, slowest {STATS['slowest_s']:.2f} s, "
              f"peak RSS {peak:.0f} MiB (children {children:.0f} MiB)")
