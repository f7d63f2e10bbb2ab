"""The event model (`plugin/reading/events.py`): launch shapes packed into one integer, and the
memory devices' labels a report shows."""

from __future__ import annotations

import pytest

from phaseprof.plugin.reading.decode import read_trace
from phaseprof.plugin.reading.events import fits_dims, pack_dims, unpack_dims
from tests.logdir import write_trace
from tests.tracebuilder import memory, step


@pytest.mark.parametrize(
    "dims",
    [
        [0, 0, 0],
        [1, 1, 1],
        [(1 << 31) - 1, (1 << 16) - 1, (1 << 16) - 1],
        [128, 4, 2],
        [3, 65535, 0],
    ],
)
def test_a_grid_within_cuda_s_limits_packs_and_unpacks_to_itself(dims):
    assert fits_dims(dims) and fits_dims(tuple(dims))
    assert unpack_dims(pack_dims(*dims)) == dims


@pytest.mark.parametrize(
    "dims",
    [
        [1 << 31, 1, 1],
        [1, 1 << 16, 1],
        [1, 1, 1 << 16],
        [-1, 1, 1],
        [1, -1, 1],
        [1, 1, -1],
        [1, 1],
        [1, 1, 1, 1],
        [1.0, 1, 1],
        [1, True, 1],
        [1, 1, "1"],
        "1,1,1",
        None,
        {"x": 1},
    ],
)
def test_a_grid_cuda_cannot_launch_is_refused(dims):
    assert not fits_dims(dims)


def test_no_launch_shape_unpacks_to_none():
    assert unpack_dims(-1) is None
    assert unpack_dims(0) == [0, 0, 0]


def test_memory_devices_are_labelled_as_torch_names_them(tmp_path):
    events = [
        step(1, 0, 100),
        memory(1, 8, 8, 0, -1),
        memory(2, 8, 16, 1, 0),
        memory(3, 8, 24, 1, 3),
        memory(4, 8, 32, 1, -1),
        memory(5, 8, 40, 0, 2),
        memory(6, 8, 48, 8, 1),
        memory(7, 8, 56, 42, 2),
        memory(8, 8, 64, 42, -1),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    # in order of (device type, id); the CPU is one device whatever its id
    assert trace.memory_devices == [
        "cpu",
        "cpu",
        "cuda",
        "cuda:0",
        "cuda:3",
        "ipu:1",
        "device42",
        "device42:2",
    ]
