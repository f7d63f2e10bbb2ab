"""The capture answer (``/capture``): whether a run can be asked for a trace now, and each request
with its ranks' answers, from a capture folder's contents built in memory (the route's tests, in
test_capture_channel, read real folders)."""

from __future__ import annotations

from phaseprof.capture_channel import Answer, Channel, Heartbeat, Request, Why
from phaseprof.plugin.analysis.captures import SHOWN, captures

#: The answer's clock: decades past the machine's, so that a rule reading the machine's clock
#: instead of the time it is given would find every request still pending.
NOW = 4_000_000_000.0


def _beat(rank, step, active=10, ended=False, time=NOW - 1):
    return Heartbeat(
        rank=rank,
        world_size=2,
        step=step,
        time=time,
        steps_per_s=5.0,
        active=active,
        schedule_until=None,
        started=NOW - 100,
        ended=ended,
    )


def _request(n, start=100, steps=5, ranks=None, by="cli", why=None, written=NOW - 200):
    """Request ``n``: written long enough ago that it is no longer pending."""
    return Request(
        id=f"{n:016x}", written=written, by=by, steps=steps, start=start, ranks=ranks, why=why
    )


def _answer(request, rank, state, **kw):
    return Answer(id=request.id, rank=rank, state=state, updated=NOW - 2, **kw)


def _channel(beats=(), requests=(), answers=()):
    table = {}
    for a in answers:
        table.setdefault(a.id, {})[a.rank] = a
    return Channel(
        beats={b.rank: b for b in beats}, requests=list(requests), answers=table, ignored=[]
    )


def test_a_running_run_can_be_asked_at_its_fastest_rank_s_step_and_its_smallest_window():
    answer = captures(
        "r", _channel([_beat(0, 40, active=10), _beat(1, 41, active=8)]), NOW, asked="abc"
    )
    assert answer.run == "r" and answer.can_ask and answer.reason is None
    assert (
        answer.step == 41 and answer.active == 8 and answer.asked == "abc" and answer.captures == []
    )


def test_a_run_nobody_watches_cannot_be_asked_and_says_why():
    answer = captures("r", _channel(), NOW)
    assert not answer.can_ask and answer.reason.startswith(
        "no running PhaseProfiler watches this run"
    )
    assert answer.step is None and answer.active is None and answer.asked is None


def test_a_running_capture_is_named_as_why_another_cannot_be_asked():
    running = _request(1, start=45, steps=10, by="tab", written=NOW - 1)
    answer = captures("r", _channel([_beat(0, 41)], [running]), NOW, read_only="read-only viewer")
    assert not answer.can_ask
    assert answer.reason == "another capture is running: steps 45–54, asked from the tab"
    assert answer.step == 41 and answer.active == 10


def test_a_read_only_viewer_is_told_so_unless_the_run_cannot_be_asked_anyway():
    answer = captures("r", _channel([_beat(0, 41)]), NOW, read_only="this TensorBoard is read-only")
    assert not answer.can_ask and answer.reason == "this TensorBoard is read-only"
    ended = captures(
        "r", _channel([_beat(0, 41, ended=True, time=NOW - 30)]), NOW, read_only="read-only"
    )
    assert not ended.can_ask and ended.reason == "the run ended at step 41 (30 s ago)"
    assert ended.step is None and ended.active is None


def test_the_newest_captures_are_listed_first_and_only_so_many():
    requests = [_request(n, start=100 + n) for n in range(SHOWN + 2)]
    answer = captures("r", _channel([_beat(0, 41)], requests), NOW)
    assert [c.id for c in answer.captures] == [r.id for r in reversed(requests[2:])]
    assert [c.first for c in answer.captures[:2]] == [100 + SHOWN + 1, 100 + SHOWN]
    assert answer.can_ask and answer.reason is None  # every request expired at NOW


def test_a_capture_lists_every_asked_rank_in_order_and_those_not_answered_wait():
    request = _request(7, start=100, steps=5)
    answers = [_answer(request, 1, "tracing", first=100, last=104, files=[])]
    answer = captures("r", _channel([_beat(1, 41), _beat(0, 40)], [request], answers), NOW)
    (info,) = answer.captures
    assert (info.id, info.by, info.written, info.first, info.last, info.ranks, info.why) == (
        request.id,
        "cli",
        NOW - 200,
        100,
        104,
        None,
        None,
    )
    assert info.state == "tracing"
    waiting, tracing = info.answers
    assert (
        waiting.rank,
        waiting.state,
        waiting.first,
        waiting.last,
        waiting.files,
        waiting.reason,
    ) == (0, "waiting", None, None, [], None)
    assert (tracing.rank, tracing.state, tracing.first, tracing.last) == (1, "tracing", 100, 104)


def test_a_capture_of_some_ranks_lists_those_and_any_rank_that_answered_anyway():
    request = _request(3, ranks=[2], by="slowdown")
    answers = [_answer(request, 0, "refused", reason="not asked")]
    (info,) = captures(
        "r", _channel([_beat(0, 40), _beat(1, 40)], [request], answers), NOW
    ).captures
    assert [a.rank for a in info.answers] == [0, 2] and info.ranks == [2]
    assert info.answers[0].reason == "not asked" and info.state == "waiting"


def test_a_capture_s_state_is_written_refused_or_partial_once_every_rank_answered_finally():
    request = _request(9)
    beats = [_beat(0, 40), _beat(1, 40)]

    def state(*ranks_states):
        answers = [
            _answer(request, r, s, files=[f"rank{r}.pt.trace.json"] if s == "written" else [])
            for r, s in ranks_states
        ]
        (info,) = captures("r", _channel(beats, [request], answers), NOW).captures
        return info

    written = state((0, "written"), (1, "written"))
    assert written.state == "written" and written.answers[1].files == ["rank1.pt.trace.json"]
    assert state((0, "refused"), (1, "refused")).state == "refused"
    assert state((0, "written"), (1, "refused")).state == "partial"
    assert state((0, "written"), (1, "accepted")).state == "waiting"
    assert state((0, "written")).state == "waiting"  # rank 1 has not answered


def test_a_capture_asked_of_no_rank_waits():
    (info,) = captures("r", _channel([], [_request(4, ranks=[])]), NOW).captures
    assert info.answers == [] and info.state == "waiting"


def test_a_slowdown_capture_carries_its_figures():
    why = Why(rank=1, steps=[38, 39], step_ms=[210.0, 220.5], median_ms=100.0, band_ms=4.5)
    (info,) = captures(
        "r", _channel([_beat(1, 41)], [_request(5, by="slowdown", why=why)]), NOW
    ).captures
    assert info.by == "slowdown"
    assert (
        info.why.rank,
        info.why.steps,
        info.why.step_ms,
        info.why.median_ms,
        info.why.band_ms,
    ) == (1, [38, 39], [210.0, 220.5], 100.0, 4.5)
