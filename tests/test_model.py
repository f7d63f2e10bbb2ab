"""What a span's analysis keeps (plugin/analysis/model.py): each table's rows of one step, and the
empty tables of a trace without modules or a critical path."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.model import PathTable, no_modules, step_rows
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import Loop, collective, memory

#: The tables a step's rows are read from, by `rows(step)`.
TABLES = (
    "ops",
    "lanes",
    "kernels",
    "memory_curve",
    "collectives",
    "blocking",
    "critical_path",
    "memory_ops",
    "memory_events",
    "apart",
)


@pytest.fixture(scope="module")
def span(tmp_path_factory):
    """Four steps, each with ops, kernels, a copy, a synchronize and a memory event; step 2 holds an
    evaluation range (time kept apart), step 3 an all_reduce."""
    loop = Loop()
    for n in range(4):
        loop.events.append(memory(loop.t + 1, 1024 * (n + 1), 4096 * (n + 1)))
        if n == 3:
            loop.events += collective("all_reduce", loop.t + 60.0, 1000, loop.t + 400.0, 25.0)
        loop.step(
            n,
            (
                "phaseprof::forward",
                100.0 + 10 * n,
                [("k1", 30.0), ("Memcpy HtoD (Pageable -> Device)", 5.0)],
                [("aten::mm", 0.0, 40.0), ("aten::relu", 50.0, 20.0)],
            ),
            ("phaseprof::backward", "sync", [("k2", 50.0)]),
            *([("phaseprof::eval", 30.0)] if n == 2 else []),
        )
    path = write_trace(tmp_path_factory.mktemp("model") / "w.1.pt.trace.json", loop.events)
    return analyze_trace(read_trace(str(path)))


def test_the_rows_of_a_step_are_the_run_of_its_index_in_the_step_column():
    column = np.array([0, 0, 1, 1, 1, 3], dtype=np.int32)
    assert step_rows(column, 0) == slice(0, 2)
    assert step_rows(column, 1) == slice(2, 5)
    assert step_rows(column, 2) == slice(5, 5)  # a step without rows
    assert step_rows(column, 3) == slice(5, 6)
    assert step_rows(column, 4) == slice(6, 6)
    bounds = step_rows(column, 1)
    assert (
        type(bounds.start) is int and type(bounds.stop) is int
    )  # plain ints, as slices of lists take
    assert step_rows(np.zeros(0, dtype=np.int32), 0) == slice(0, 0)


@pytest.mark.parametrize("table", TABLES)
def test_each_table_gives_the_rows_of_each_step_and_only_those(span, table):
    t = getattr(span, table)
    seen = []
    for k in range(len(span.steps)):
        rows = t.rows(k)
        assert (t.step[rows] == k).all(), (table, k)
        seen += range(len(t.step))[rows]
    assert seen == list(range(len(t.step)))  # every row once, in order
    if table == "collectives":
        assert t.rows(3) == slice(0, 1) and t.rows(0) == slice(0, 0)
    elif table == "apart":
        assert t.rows(2) == slice(0, 1) and t.rows(3) == slice(1, 1)
    else:
        assert all(t.rows(k).stop > t.rows(k).start for k in range(4)), table  # every step has rows


def test_a_trace_without_modules_has_an_empty_module_table_of_the_usual_types():
    m = no_modules()
    assert m.source == "" and m.paths == []
    types = {
        "parent": np.int32,
        "step": np.int32,
        "module": np.int32,
        "calls": np.int64,
        "forward_us": np.float64,
        "forward_self_us": np.float64,
        "forward_gpu_us": np.float64,
        "backward_us": np.float64,
        "backward_gpu_us": np.float64,
        "op_step": np.int32,
        "op_module": np.int32,
        "op_name": np.int32,
        "op_backward": np.bool_,
        "op_calls": np.int64,
        "op_us": np.float64,
        "op_gpu_us": np.float64,
    }
    for field, dtype in types.items():
        values = getattr(m, field)
        assert values.shape == (0,) and values.dtype == dtype, field


def test_an_empty_critical_path_keeps_its_streams_and_has_no_rows_of_the_usual_types():
    p = PathTable.empty(["GPU 0 stream 7", "GPU 0 stream 20"])
    assert p.streams == ["GPU 0 stream 7", "GPU 0 stream 20"]
    types = {
        "step": np.int32,
        "start": np.float64,
        "end": np.float64,
        "lane": np.int32,
        "kind": np.int8,
        "name": np.int32,
        "phase": np.int32,
        "blocked": np.bool_,
    }
    for field, dtype in types.items():
        values = getattr(p, field)
        assert values.shape == (0,) and values.dtype == dtype, field
    assert p.rows(0) == slice(0, 0)
