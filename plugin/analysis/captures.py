"""A run's captures (traces of its next steps asked while it runs), from what its capture folder
holds (`phaseprof.capture_channel.Channel`): each request with every asked rank's answer, and
whether the run can be asked now."""

from __future__ import annotations

from phaseprof.capture_channel import FINAL, REFUSED, WRITTEN, Channel, Request, describe, live_beats, pending

from ..answers import CaptureAnswer, CaptureInfo, RankCapture, SlowdownWhy

#: Captures an answer lists, newest first.
SHOWN = 20


def captures(run: str, channel: Channel, now: float, read_only: str | None = None,
             asked: str | None = None) -> CaptureAnswer:
    """``read_only``: why this viewer may not ask (it is read-only), if it may not."""
    live, why_not = live_beats(channel, now)
    waiting = pending(channel, now) if live else None
    if why_not is None and waiting is not None:
        why_not = f"another capture is running: {describe(waiting)}"
    if why_not is None and read_only:
        why_not = read_only
    return CaptureAnswer(
        run=run,
        can_ask=why_not is None,
        reason=why_not,
        step=max((b.step for b in live.values()), default=None),
        active=min((b.active for b in live.values()), default=None),
        asked=asked,
        captures=[_info(r, channel) for r in reversed(channel.requests[-SHOWN:])],
    )


def _info(request: Request, channel: Channel) -> CaptureInfo:
    answers = channel.answers.get(request.id, {})
    ranks = sorted(set(request.ranks if request.ranks is not None else channel.beats) | set(answers))
    rows = []
    for rank in ranks:
        a = answers.get(rank)
        rows.append(RankCapture(rank=rank, state="waiting", first=None, last=None, files=[], reason=None)
                    if a is None else
                    RankCapture(rank=rank, state=a.state, first=a.first, last=a.last, files=a.files, reason=a.reason))
    states = {r.state for r in rows}
    if rows and states <= set(FINAL):
        state = WRITTEN if states == {WRITTEN} else REFUSED if states == {REFUSED} else "partial"
    else:
        state = "tracing" if "tracing" in states else "waiting"
    why = request.why
    return CaptureInfo(
        id=request.id, by=request.by, written=request.written, first=request.start,
        last=request.start + request.steps - 1, ranks=request.ranks, state=state, answers=rows,
        why=None if why is None else SlowdownWhy(rank=why.rank, steps=why.steps, step_ms=why.step_ms,
                                                 median_ms=why.median_ms, band_ms=why.band_ms))
