"""What a trace says about its machine, read on both decoding paths (typed, and event by event for
files with malformed events): each GPU's compute capability, and the CPUs the training process may use."""

from __future__ import annotations

import pytest

from phaseprof.contract import CPUS_KEY
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import Loop

GPUS = [{"id": 0, "name": "NVIDIA GeForce GTX 1080 Ti", "computeMajor": 6, "computeMinor": 1},
        {"id": 1, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0},
        {"id": 2, "name": "no capability"}]


def _events(malformed: bool) -> list[dict]:
    loop = Loop()
    for n in range(2):
        loop.step(n, ("phaseprof::forward", 1_000, [("volta_sgemm_128x64_nn", 300)]))
    if malformed:  # one event the typed decoder refuses: the file is read event by event
        loop.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": "soon"})
    return loop.events


@pytest.mark.parametrize("malformed", [False, True])
def test_compute_capability_and_cpus_are_read_on_both_paths(tmp_path, malformed):
    path = write_trace(tmp_path / "w.1.pt.trace.json", _events(malformed), deviceProperties=GPUS,
                       **{CPUS_KEY: {"count": 64, "usable": 12}})
    trace = read_trace(str(path))
    assert trace.gpu_names == [g["name"] for g in GPUS]
    assert trace.gpu_capabilities == ["6.1", "8.0", ""]
    assert trace.cpus == 12


def test_a_forged_capability_is_no_capability(tmp_path):
    forged = [{"id": 0, "name": "a", "computeMajor": "seven"}, {"id": 1, "name": "b", "computeMajor": -1},
              {"id": 2, "name": "c", "computeMajor": 9, "computeMinor": 12}]
    path = write_trace(tmp_path / "w.1.pt.trace.json", _events(False), deviceProperties=forged)
    assert read_trace(str(path)).gpu_capabilities == ["", "", ""]


@pytest.mark.parametrize("cpus, read", [({"count": 8}, 8), ({"count": 8, "usable": None}, 8),
                                        ({"count": 0, "usable": 0}, None), ({"count": "8", "usable": True}, 8),
                                        ({"count": 2.5}, None), ([8], None)])
def test_the_usable_cpus_are_the_affinity_else_the_count(tmp_path, cpus, read):
    path = write_trace(tmp_path / "w.1.pt.trace.json", _events(False), **{CPUS_KEY: cpus})
    assert read_trace(str(path)).cpus == read


def test_a_cpu_count_of_the_wrong_type_is_no_count(tmp_path):
    # read as no count, and the file's events are read as usual
    path = write_trace(tmp_path / "w.1.pt.trace.json", _events(False), **{CPUS_KEY: "many"})
    trace = read_trace(str(path))
    assert trace.cpus is None and len(trace.host) > 0
