"""A step's critical path (`critical_path`) as an answer, the mean path over steps, and what fills it.

What fills the path most (`CriticalPath.bound`) is read off its stretches: those inside the host
window of a call the path waits in are ``host-blocked`` (the host was held, whatever ran then);
of the others, host time is ``data`` in the data phase and ``host`` elsewhere, launching (launch
calls on the host, and launch to device start) is ``launch``, kernels, copies and the gaps between
device work are ``gpu``, collectives ``communication``. The largest wins; a tie goes to the first in
`BOUNDS`.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import DATA

from ..answers import CriticalPath, PathSegment, PathShare
from .critical_path import COLLECTIVE, GAP_NAMES, KINDS, LAUNCH, PHASE, SYNC
from .model import SpanAnalysis
from .worker import Worker, ms

#: What can fill a path, in the order ties are broken.
BOUNDS = ("host-blocked", "gpu", "communication", "launch", "data", "host")
#: Items listed on a path.
TOP_ITEMS = 20


class PathFigures:
    """A path (one step's, or the mean of several) as sums of µs: its length, per phase, per (kind,
    name) item, per (phase, kind), and per bound."""

    def __init__(self):
        self.steps = 0
        self.length = 0.0
        self.phases: dict[str, float] = {}
        self.items: dict[tuple[str, str], float] = {}
        self.phase_kinds: dict[tuple[str, str], float] = {}
        self.bounds = dict.fromkeys(BOUNDS, 0.0)

    def add(self, span: SpanAnalysis, i: int) -> None:
        """Adds the path of step ``i`` of ``span``."""
        p = span.critical_path
        r = p.rows(i)
        self.steps += 1
        us = p.end[r] - p.start[r]
        self.length += float(us.sum())
        kind, name, phase, lane = p.kind[r], p.name[r], p.phase[r], p.lane[r]
        for j, v in _sums(phase, us).items():
            if j >= 0:
                self.phases[span.phases[j]] = self.phases.get(span.phases[j], 0.0) + v
        width = len(span.names) + 8  # names from -8 up
        for k, v in _sums(kind.astype(np.int64) * width + (name + 8), us).items():
            kd, nm = divmod(k, width)
            if kd == PHASE:  # host time in no op: named by its phase (summed below)
                continue
            nm -= 8
            item = (KINDS[kd], span.names[nm] if nm >= 0 else GAP_NAMES.get(nm, ""))
            self.items[item] = self.items.get(item, 0.0) + v
        for j, v in _sums(np.where(kind == PHASE, phase, -1), us).items():
            if j >= 0:
                item = ("phase", span.phases[j])
                self.items[item] = self.items.get(item, 0.0) + v
        for k, v in _sums(phase.astype(np.int64) * len(KINDS) + kind, us).items():
            j, kd = divmod(k, len(KINDS))
            if j >= 0:
                pk = (span.phases[j], KINDS[kd])
                self.phase_kinds[pk] = self.phase_kinds.get(pk, 0.0) + v
        data = span.phases.index(DATA) if DATA in span.phases else -2
        on_host = lane < 0
        bound = np.where(p.blocked[r] | (kind == SYNC), 0,
                         np.where(kind == LAUNCH, 3,
                                  np.where(on_host, np.where(phase == data, 4, 5),
                                           np.where(kind == COLLECTIVE, 2, 1))))
        for b, v in _sums(bound, us).items():
            self.bounds[BOUNDS[b]] += v

    def bound(self) -> str:
        return max(BOUNDS, key=lambda b: (self.bounds[b], -BOUNDS.index(b)))

    def answer(self, segments: list[PathSegment]) -> CriticalPath:
        n = max(self.steps, 1)
        length = self.length / n
        items = sorted(self.items.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_ITEMS]
        return CriticalPath(
            length_ms=ms(length), bound=self.bound(),
            phases={p: ms(v / n) for p, v in self.phases.items()},
            items=[PathShare(name=name, kind=kind, ms=ms(v / n),
                             share=round(v / n / length, 4) if length > 0 else 0.0)
                   for (kind, name), v in items],
            segments=segments)


def _sums(key: np.ndarray, weights: np.ndarray) -> dict[int, float]:
    """Sums of ``weights`` per distinct ``key``."""
    keys, inverse = np.unique(key, return_inverse=True)
    return dict(zip(keys.tolist(), np.bincount(inverse.ravel(), weights=weights,
                                               minlength=len(keys)).tolist()))


def step_path(span: SpanAnalysis, i: int) -> CriticalPath | None:
    """The critical path of step ``i`` of ``span`` (None: the span has no device activity)."""
    if not span.has_gpu:
        return None
    f = PathFigures()
    f.add(span, i)
    p = span.critical_path
    r = p.rows(i)
    segments = [
        PathSegment(start_ms=ms(a), end_ms=ms(b), lane="host" if lane < 0 else p.streams[lane],
                    kind=KINDS[k], name=_name(span, k, nm, ph))
        for a, b, lane, k, nm, ph in zip(p.start[r].tolist(), p.end[r].tolist(), p.lane[r].tolist(),
                                         p.kind[r].tolist(), p.name[r].tolist(), p.phase[r].tolist())
    ]
    return f.answer(_merged(segments))


def _name(span: SpanAnalysis, kind: int, name: int, phase: int) -> str:
    if name >= 0:
        return span.names[name]
    if kind == PHASE and phase >= 0:
        return span.phases[phase]
    return GAP_NAMES.get(name, "")


def _merged(segments: list[PathSegment]) -> list[PathSegment]:
    """Consecutive segments of one lane and name as one (the table keeps phases and blocking
    apart)."""
    out: list[PathSegment] = []
    for s in segments:
        last = out[-1] if out else None
        if last is not None and (last.lane, last.kind, last.name) == (s.lane, s.kind, s.name) \
                and last.end_ms == s.start_ms:
            last.end_ms = s.end_ms
        else:
            out.append(s)
    return out


def path_figures(w: Worker, rows: np.ndarray) -> PathFigures | None:
    """The paths of the steps ``rows`` of ``w`` that ran on a GPU, summed (None: none did)."""
    f = PathFigures()
    for row in rows.tolist():
        ref = w.refs[row]
        if ref.span.has_gpu:
            f.add(ref.span, ref.index)
    return f if f.steps else None


def mean_path(w: Worker, rows: np.ndarray) -> CriticalPath | None:
    """The mean critical path per step over ``rows`` (the summary's: no segments)."""
    f = path_figures(w, rows)
    return f.answer([]) if f is not None else None

