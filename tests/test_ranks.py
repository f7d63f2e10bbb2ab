"""Rank against rank (plugin/analysis/ranks.py): each rank's mean step in host time, the straggler
and what it says, the ranks a world misses and the files that are not ranks. Hand-built ranks,
analysed in-process; test_gpu_measures checks the GPU measure on recorded and built jobs."""

from __future__ import annotations

import itertools

import pytest

from phaseprof.noise import noise
from phaseprof.plugin.analysis.ranks import _missing, ranks
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.answers import Times
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import Loop

_FILES = itertools.count()


def _rank(folder, name, rank, steps, forward, backward, reduce_us, world=2, empty=0):
    """A worker whose steps n take ``forward`` + 50 n µs, then ``backward`` µs holding an all_reduce
    of ``reduce_us`` on the host; ``empty`` steps without work after them."""
    loop = Loop()
    for n in range(steps):
        loop.step(
            n,
            ("phaseprof::forward", forward + 50.0 * n),
            ("phaseprof::backward", backward, [], [("nccl:all_reduce", 100.0, reduce_us)]),
        )
    for n in range(steps, steps + empty):
        loop.t += 10.0
        loop.step(n)
    top = {} if rank is None else {"distributedInfo": {"rank": rank, "world_size": world}}
    path = write_trace(folder / f"{name}.{next(_FILES)}.pt.trace.json", loop.events, **top)
    return Worker(name, [analyze_trace(read_trace(str(path)))])


def test_the_rank_that_computes_longest_is_the_straggler_the_others_wait_for(tmp_path):
    # rank 0 waits 10 ms a step in the all_reduce for rank 1, whose forward takes 10 ms longer:
    # both steps take 25 ms, and only the time outside collectives tells them apart
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "b", 1, 6, 20_000.0, 5_000.0, 200.0),
            _rank(tmp_path, "a", 0, 6, 10_000.0, 15_000.0, 10_000.0),
        ],
    )
    assert (answer.run, answer.measure, answer.phases) == ("job", "host", ["forward", "backward"])
    assert (answer.world_size, answer.missing_ranks, answer.not_ranks) == (2, [], [])
    r0, r1 = answer.ranks  # in rank order
    assert (r0.worker, r0.rank, r0.steps, r0.wall_ms, r0.step_ms) == ("a", 0, 6, 25.125, 25.125)
    assert (r0.comm_ms, r0.compute_ms, r0.exposed_comm_ms) == (10.0, 15.125, 0.0)
    assert r0.phases == {
        "forward": Times(host_ms=10.125, gpu_ms=0.0),
        "backward": Times(host_ms=15.0, gpu_ms=0.0),
    }
    assert r0.phase_compute_ms == {"forward": 10.125, "backward": 5.0}
    assert (r1.worker, r1.rank, r1.comm_ms, r1.compute_ms) == ("b", 1, 0.2, 24.925)
    assert r1.phase_compute_ms == {"forward": 20.125, "backward": 4.8}
    s = answer.straggler
    band = noise([15_000.0 + 50 * n for n in range(6)])  # rank 0's compute per step
    assert (s.worker, s.rank, s.wall_ms, s.behind_median_ms) == ("b", 1, 25.125, 0.0)
    assert (s.comm_ms, s.median_comm_ms, s.waited_for) == (0.2, 10.0, True)
    assert (s.phase, s.phase_behind_ms) == ("forward", 10.0)
    assert s.noise_ms == pytest.approx(band.band / 1000, abs=0.0005) and band.median == 15_100.0
    assert s.reason == (
        f"rank 1 computes 24.93 ms per step (its step less collectives), the other ranks 15.10 ms, "
        f"beyond their noise of ±{band.band / 1000:.2f} ms; the other ranks wait for it at "
        "collectives: 10.00 ms per step in them, rank 1 0.20 ms"
    )
    assert answer.note == f"rank 1 is the straggler: {s.reason}"


def test_a_straggler_nobody_waits_for_is_behind_the_median_step(tmp_path):
    # no collective time to speak of: rank 1's steps are 10 ms longer
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 10.0),
            _rank(tmp_path, "b", 1, 6, 20_000.0, 5_000.0, 10.0),
            _rank(tmp_path, "c", 2, 6, 10_200.0, 5_000.0, 10.0, world=3),
        ],
    )
    s = answer.straggler
    assert (s.rank, s.waited_for, s.phase) == (1, False, "forward")
    # its step 25.125 ms against the median step of the three, rank 2's 15.325
    assert s.behind_median_ms == 9.8 and s.median_comm_ms == 0.01
    assert "wait for it" not in s.reason
    assert s.reason.startswith(
        "rank 1 computes 25.11 ms per step (its step less collectives), the other ranks 15."
    )


def test_ranks_within_noise_are_even(tmp_path):
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "b", 1, 6, 10_100.0, 5_000.0, 100.0),
        ],
    )
    assert answer.straggler is None
    band = noise(
        [14_900.0 + 50 * n for n in range(6)]
    )  # rank 0's compute; its lower median 15,000 µs
    assert answer.note == (
        f"the ranks are even: every rank's compute per step (its step less collectives) lies "
        f"within ±{band.band / 1000:.2f} ms of the others' median (15.00 ms)"
    )


def test_too_few_steps_in_a_rank_name_it(tmp_path):
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "b", 1, 4, 30_000.0, 5_000.0, 100.0),
        ],
    )
    assert answer.straggler is None
    assert (
        answer.note
        == "too few steps to tell the ranks apart: rank 1 has 4 (at least 5 per rank are needed)"
    )


def test_one_worker_or_none_with_steps_has_no_straggler_to_find(tmp_path):
    one = ranks("job", [_rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0, world=1)])
    assert one.straggler is None and one.note == "one worker: no straggler to find"
    idle = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 0, 0.0, 0.0, 0.0, empty=2),
            _rank(tmp_path, "b", 1, 0, 0.0, 0.0, 0.0, empty=2),
        ],
    )
    assert [r.steps for r in idle.ranks] == [0, 0]
    assert idle.straggler is None and idle.note == "no worker has steps: no straggler to find"
    assert ranks("job", []).ranks == [] and ranks("job", []).measure == "host"


def test_ranks_missing_from_the_world_are_named_before_the_verdict(tmp_path):
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0, world=4),
            _rank(tmp_path, "b", 1, 6, 10_100.0, 5_000.0, 100.0, world=4),
        ],
    )
    assert (answer.world_size, answer.missing_ranks) == (4, [2, 3])
    assert answer.note.startswith(
        "ranks 2-3 of world size 4 have no trace here: the comparison is of the ranks "
        "present; the ranks are even"
    )
    assert (
        _missing([1], 2)
        == "rank 1 of world size 2 has no trace here: the comparison is of the ranks present"
    )
    assert _missing([0, 2, 3, 5, 7, 8, 9], 10).startswith(
        "ranks 0, 2-3, 5, 7-9 of world size 10 have no trace"
    )


def test_other_files_of_a_rank_or_of_one_recording_are_not_ranks(tmp_path):
    a = _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0)
    again = _rank(tmp_path, "a-copy", 0, 6, 12_000.0, 5_000.0, 100.0)  # rank 0 again
    answer = ranks("job", [a, again, _rank(tmp_path, "b", 1, 6, 10_100.0, 5_000.0, 100.0)])
    assert [r.worker for r in answer.ranks] == ["a", "b"] and answer.not_ranks == ["a-copy"]
    assert answer.note.endswith(
        "; a-copy: other file of a worker listed (the same rank, or the same steps at "
        "the same times), not ranks"
    )
    # without ranks: the same steps at the same times are one recording, other times another worker
    x = _rank(tmp_path, "x", None, 6, 10_000.0, 5_000.0, 100.0)
    x2 = _rank(tmp_path, "x2", None, 6, 10_000.0, 5_000.0, 100.0)
    y = _rank(tmp_path, "y", None, 6, 10_000.4, 5_000.0, 100.0)  # 0.4 µs later: the same, to the µs
    z = _rank(tmp_path, "z", None, 6, 11_000.0, 5_000.0, 100.0)
    answer = ranks("cpu", [x, x2, y, z])
    assert [r.worker for r in answer.ranks] == ["x", "z"] and answer.not_ranks == ["x2", "y"]
    assert "; x2, y: other files of a worker listed" in answer.note
    assert [r.rank for r in answer.ranks] == [None, None]
    assert answer.note.startswith("z is the straggler: z computes 16.02 ms per step")


def test_a_worker_without_a_rank_is_named_by_its_worker_name(tmp_path):
    answer = ranks(
        "cpu",
        [
            _rank(tmp_path, "fast", None, 6, 10_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "slow", None, 6, 30_000.0, 5_000.0, 100.0),
        ],
    )
    assert answer.straggler.worker == "slow" and answer.straggler.rank is None
    assert answer.note.startswith("slow is the straggler: slow computes")
    assert answer.world_size is None and answer.missing_ranks == []


def test_ranks_are_listed_by_rank_then_by_name_and_a_lone_step_is_its_own_mean(tmp_path):
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 1, 1, 10_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "b", 0, 6, 10_000.0, 5_000.0, 100.0),
        ],
    )
    assert [(r.worker, r.rank) for r in answer.ranks] == [("b", 0), ("a", 1)]
    assert (answer.ranks[1].steps, answer.ranks[1].step_ms, answer.ranks[1].comm_ms) == (
        1,
        15.0,
        0.1,
    )
    unranked = ranks(
        "cpu",
        [
            _rank(tmp_path, "slow", None, 6, 30_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "fast", None, 6, 10_000.0, 5_000.0, 100.0),
        ],
    )
    assert [r.worker for r in unranked.ranks] == ["fast", "slow"]


def test_the_straggler_s_phase_is_where_it_computes_longest_against_the_others(tmp_path):
    answer = ranks(
        "job",
        [
            _rank(tmp_path, "a", 0, 6, 10_000.0, 5_000.0, 100.0),
            _rank(tmp_path, "b", 1, 6, 10_000.0, 15_000.0, 100.0),
        ],
    )
    assert (answer.straggler.rank, answer.straggler.phase) == (1, "backward")
    assert answer.straggler.phase_behind_ms == 10.0


def test_a_file_without_a_rank_of_a_ranked_worker_s_steps_is_not_a_rank(tmp_path):
    ranked = _rank(tmp_path, "x", 0, 6, 10_000.0, 5_000.0, 100.0)
    copy = _rank(tmp_path, "x-export", None, 6, 10_000.0, 5_000.0, 100.0)
    answer = ranks("job", [ranked, copy])
    assert [r.worker for r in answer.ranks] == ["x"] and answer.not_ranks == ["x-export"]
