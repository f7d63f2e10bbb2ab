"""Python call stacks of ops (`plugin/analysis/stacks.py`): the call-path tree of hand-placed
frames, the frame covering an instant, an op's stack and the user's own frame in it."""

from __future__ import annotations

import numpy as np

from phaseprof.plugin.analysis import stacks
from phaseprof.plugin.analysis.nesting import nest
from tests.test_nesting import host

NAMES = ["train.py(10): main", "model.py(20): forward", "torch/nn/functional.py(30): relu"]
MAIN, FORWARD, RELU = range(3)


def frames(*events: tuple[float, float, int, int]):
    """Python frames from (start µs, duration µs, thread, name code)."""
    h = host(*[e[:3] for e in events])
    h.name[:] = [e[3] for e in events]
    return h


def stack_of(paths, node) -> list[str]:
    return stacks.stack(paths, NAMES, int(node))


def test_each_frame_gets_its_call_path_and_repeated_paths_are_one_node():
    # thread 0: main [0, 100) calls forward twice, the first calling relu; thread 1: main calls relu
    python = frames(
        (0, 100, 0, MAIN),
        (10, 30, 0, FORWARD),
        (15, 5, 0, RELU),
        (50, 30, 0, FORWARD),
        (0, 50, 1, MAIN),
        (10, 10, 1, RELU),
    )
    paths, n, node = stacks.call_paths(python)
    got = [(int(n.name[k]), stack_of(paths, node[k])) for k in range(len(node))]
    assert sorted(got) == sorted(
        [
            (MAIN, [NAMES[MAIN]]),
            (FORWARD, [NAMES[FORWARD], NAMES[MAIN]]),
            (RELU, [NAMES[RELU], NAMES[FORWARD], NAMES[MAIN]]),
            (FORWARD, [NAMES[FORWARD], NAMES[MAIN]]),
            (MAIN, [NAMES[MAIN]]),
            (RELU, [NAMES[RELU], NAMES[MAIN]]),
        ]
    )
    # main (on both threads), main>forward (twice), main>relu, main>forward>relu
    assert len(paths.parent) == len(paths.name) == 4
    assert paths.parent.dtype == paths.name.dtype == np.int32
    # numbered depth by depth: main; main>forward, main>relu; main>forward>relu
    assert (paths.parent.tolist(), paths.name.tolist()) == (
        [-1, 0, 0, 1],
        [MAIN, FORWARD, RELU, RELU],
    )


def test_no_frames_no_paths():
    paths, n, node = stacks.call_paths(frames())
    assert len(paths.parent) == len(paths.name) == len(node) == 0


def test_the_innermost_frame_covering_an_instant():
    # main [0, 100) > forward [10, 40) > relu [15, 20); a zero-length frame at 30 inside forward
    python = frames((0, 100, 0, MAIN), (10, 30, 0, FORWARD), (15, 5, 0, RELU), (30, 0, 0, RELU))
    n = nest(python)
    ts = np.array([5, 10, 15, 19.5, 20, 30, 40, 99, 100, -1, 50], dtype=np.float64)
    thread = np.array([0] * 10 + [1], dtype=np.int32)
    found = stacks.enclosing(n, thread, ts)
    covering = [k if k < 0 else (float(n.ts[k]), float(n.dur[k])) for k in found.tolist()]
    assert covering == [
        (0, 100),
        (10, 30),
        (15, 5),
        (15, 5),
        (10, 30),
        (30, 0),
        (0, 100),
        (0, 100),
        -1,
        -1,
        -1,
    ]


def test_the_covering_frame_is_found_up_a_deep_chain():
    # 40 frames each inside the one before, [k, 100 - k); then one more after them (-1: none)
    python = frames(*[(k, 100 - 2 * k, 0, MAIN) for k in range(40)], (150, 10, 0, FORWARD))
    n = nest(python)
    ts = np.array([95.5, 60.5, 39.5, 70, 155, 160], dtype=np.float64)
    found = stacks.enclosing(n, np.zeros(len(ts), np.int32), ts)
    starts = [k if k < 0 else float(n.ts[k]) for k in found.tolist()]
    # 95.5 lies in [k, 100 - k) for k <= 4; 60.5 for k <= 39; 39.5 in all 40; 70 for k < 30
    assert starts == [4, 39, 39, 29, 150, -1]


def test_nothing_covers_an_instant_of_an_empty_trace():
    assert stacks.enclosing(
        nest(frames()), np.zeros(2, np.int32), np.array([1.0, 2.0])
    ).tolist() == [-1, -1]
    n = nest(frames((0, 10, 0, MAIN)))
    assert stacks.enclosing(n, np.zeros(0, np.int32), np.zeros(0)).tolist() == []


def test_an_op_keeps_the_node_of_its_innermost_frame():
    python = frames((0, 100, 0, MAIN), (10, 30, 0, FORWARD), (200, 10, 1, RELU))
    ops = nest(host((12, 5, 0), (50, 5, 0), (150, 5, 0), (201, 2, 1), (201, 1, 2)))
    paths, node = stacks.op_paths(python, ops)
    assert [stack_of(paths, k) for k in node] == [
        [NAMES[FORWARD], NAMES[MAIN]],
        [NAMES[MAIN]],
        [],
        [NAMES[RELU]],
        [],
    ]
    assert node[2] == node[4] == -1


def test_ops_of_a_trace_without_stacks_have_none():
    ops = nest(host((12, 5, 0), (50, 5, 0)))
    paths, node = stacks.op_paths(frames(), ops)
    assert node.tolist() == [-1, -1] and len(paths.parent) == 0


def test_a_stack_shows_at_most_its_innermost_frames():
    depth = stacks.MAX_FRAMES + 6
    names = [f"f{k}.py(1): f{k}" for k in range(depth)]
    paths = stacks.CallPaths(
        parent=np.arange(-1, depth - 1, dtype=np.int32), name=np.arange(depth, dtype=np.int32)
    )
    shown = stacks.stack(paths, names, depth - 1)
    assert shown == names[::-1][: stacks.MAX_FRAMES]
    assert stacks.stack(paths, names, 0) == [names[0]]
    assert stacks.stack(paths, names, -1) == [] and stacks.stack(paths, names, depth) == []


def test_the_users_frames_are_neither_libraries_nor_the_standard_library():
    user = [
        "train.py(12): main",
        "mylib/model.py(3): forward",
        "/home/me/run.py(1): <module>",
        "trainer.py(5): fit",
        "torchy/x.py(2): f",
        "src/(weird).py(1): f",
    ]
    not_user = [
        "",
        "<built-in method relu of type object at 0x7f>",
        "nn.Module: Linear_0",
        "venv/lib/python3.11/site-packages/foo/x.py(1): f",
        "x/dist-packages/foo/x.py(1): f",
        "/usr/lib/python3.11/json/decoder.py(353): raw_decode",
        "torch/nn/modules/module.py(1782): _call_impl",
        "numpy.py(3): f",
        "tqdm.py(10): update",
        "lightning/fabric.py(1): f",
        "phaseprof/hooks.py(1): f",
        "json/decoder.py(353): raw_decode",
        "threading.py(1012): run",
        "typing_extensions.py(1): f",
    ]
    assert [f for f in user if stacks.is_user_frame(f)] == user
    assert [f for f in not_user if stacks.is_user_frame(f)] == []


def test_the_user_frame_of_a_stack_is_its_innermost_one():
    frames_ = [
        "<built-in method mm>",
        "torch/nn/modules/linear.py(125): forward",
        "model.py(20): forward",
        "train.py(10): main",
    ]
    assert stacks.user_frame(frames_) == "model.py(20): forward"
    assert stacks.user_frame(frames_[:2]) is None and stacks.user_frame([]) is None
