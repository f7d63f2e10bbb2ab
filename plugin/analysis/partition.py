"""Steps, and the phase of every instant of every step on the host timeline.

Within a step each instant belongs to exactly one phase: the innermost phase range covering it,
else ``other``. Phase ranges come from range names (see `names`) on any thread of the
process; where a step has no forward or backward range, those phases are inferred from the ops:

* backward: spanned by the autograd engine's ops (any thread), from the gradient seed
  (``aten::ones_like``) on the calling thread to where that thread resumes. On CUDA builds the
  engine runs on its own thread and the caller stays blocked in ``loss.backward()`` until the
  engine's last work ends, so the window ends at the last activity of the other threads before the
  caller's next op, not at the last autograd op;
* forward: the top-level host work of the loop's thread outside the other phases, up to the
  step's last backward segment (in steps without backward, all of it).

Gradient accumulation gives several forward/backward segments per step.

Time kept out of the training steps — the hook's ``phaseprof::eval`` (an evaluation pass) and
``phaseprof::paused`` (``with prof.paused():``) ranges — belongs to no phase and no step, whatever
ranges lie inside it: those instants are holes in the partition (`Partition.locate` places them in no
step, so nothing launched or allocated there counts either), and each step records how much of its
window they held (`Step.apart`). As the hook does, an evaluation pass that begins before the
step's first training work also takes the ``other`` time just before its first forward (the eval
loader's first batch, ``model.eval()``).

Steps are the ``ProfilerStep#N`` ranges. A trace without them (``torch.autograd.profiler.profile()``
around a loop) that repeats the loop's own marks (``enumerate(DataLoader)#…``,
``Optimizer.zero_grad#…``, ``Optimizer.step#…``, the gradient seed of ``loss.backward()``) is cut
into one inferred step per iteration; with neither, the whole trace is one step.
"""

from __future__ import annotations

import heapq
from collections import Counter

import msgspec
import numpy as np

from phaseprof.contract import BACKWARD, EVAL, FORWARD, OPTIMIZER, OTHER, OUT_OF_STEP, PHASES

from ..reading.events import OP, Trace
from .names import GRAD_SEED, LOOP_SEED, LOOP_STEP, is_autograd, loop_marker, out_of_step, range_phase, step_number
from .nesting import Nesting

Interval = tuple[float, float]  # (start, end) µs
Segment = tuple[float, float, int]  # (start, end, phase code)

APART = 2  # tiers: time kept out of the steps beats every phase range,
EXPLICIT = 1  # and a range in the trace beats an inferred one wherever they overlap
INFERRED = 0
NO_PHASE = -1  # phase code of events that mark no phase; out-of-step kinds are coded below it


def apart_code(kind: int) -> int:
    """The phase code of out-of-step kind ``kind`` (an index into `OUT_OF_STEP`) while partitioning."""
    return -2 - kind


class Step(msgspec.Struct, gc=False):
    """One step's host window (µs, trace clock). Untracked by the garbage collector (it holds no
    cycle): one per step, 50,000 of them kept it busy."""

    number: int
    start: float
    end: float
    #: Host events inside the step other than its own marker; 0 for the empty last step of a loop
    #: that ended inside the profiler's active window.
    events: int = 0
    #: Phases of this step that were inferred from ops rather than marked by ranges.
    inferred: set[str] = msgspec.field(default_factory=set)
    #: The step's window was inferred from the loop's repeated marks (the trace marks no steps).
    inferred_step: bool = False
    #: Host µs of the window kept out of the step, by kind (`phaseprof.contract.OUT_OF_STEP`); only
    #: the kinds it held.
    apart: dict[str, float] = msgspec.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.events == 0

    @property
    def wall(self) -> float:
        """The step's own time (µs): its window less the time kept out of it."""
        return self.end - self.start - sum(self.apart.values())


class Partition(msgspec.Struct):
    """The phase segments of all steps in time order; every step is covered without gaps but for
    the time kept out of it, the ``apart_*`` segments (kind: an index into `OUT_OF_STEP`)."""

    steps: list[Step]
    phases: list[str]  # phase names by code: the canonical ones first, then user phases
    start: np.ndarray  # float64 µs
    end: np.ndarray
    phase: np.ndarray  # int32 code into `phases`
    step: np.ndarray  # int32 index into `steps`
    main_thread: int  # thread code of the thread that runs the loop
    process_threads: np.ndarray  # bool per thread code: a thread of the loop's process
    marker_names: np.ndarray  # bool per name code: a phase range or step marker (not an op)
    apart_start: np.ndarray  # float64 µs, in time order
    apart_end: np.ndarray
    apart_kind: np.ndarray  # int32 index into OUT_OF_STEP
    apart_step: np.ndarray  # int32 index into `steps`: the step whose window holds it

    def locate_apart(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step index, out-of-step kind) of each instant in ``ts`` kept out of a step; -1 elsewhere."""
        if not len(self.apart_start):
            return np.full(len(ts), -1, np.int32), np.full(len(ts), -1, np.int32)
        seg = self.apart_start.searchsorted(ts, side="right") - 1
        inside = (seg >= 0) & (ts < self.apart_end[np.maximum(seg, 0)])
        seg = np.where(inside, seg, -1)
        return np.where(inside, self.apart_step[seg], -1), np.where(inside, self.apart_kind[seg], -1)

    def locate(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step index, phase code) of each instant in ``ts``; -1 for instants outside every step."""
        if not len(self.start):  # no step holds any time (all steps zero-length, or none)
            return np.full(len(ts), -1, np.int32), np.full(len(ts), -1, np.int32)
        seg = self.start.searchsorted(ts, side="right") - 1
        inside = (seg >= 0) & (ts < self.end[np.maximum(seg, 0)])
        seg = np.where(inside, seg, -1)
        return np.where(inside, self.step[seg], -1), np.where(inside, self.phase[seg], -1)


def partition(trace: Trace, nest: Nesting) -> Partition:
    """Find the steps of ``trace`` and split each into phase segments."""
    names = trace.names
    name_sorted = nest.name
    kind_sorted = nest.kind
    phases = list(PHASES)
    code_of = {p: i for i, p in enumerate(phases)}
    name_phase = np.full(len(names), NO_PHASE, dtype=np.int32)
    name_step = np.full(len(names), -1, dtype=np.int64)
    name_autograd = np.zeros(len(names), dtype=bool)
    for i, name in enumerate(names):
        kind = out_of_step(name)
        if kind is not None:
            name_phase[i] = apart_code(OUT_OF_STEP.index(kind))
        phase = range_phase(name)
        if phase is not None:
            if phase not in code_of:
                code_of[phase] = len(phases)
                phases.append(phase)
            name_phase[i] = code_of[phase]
        number = step_number(name)
        if number is not None:
            name_step[i] = number
        name_autograd[i] = is_autograd(name)
    event_phase = name_phase[name_sorted] if len(name_sorted) else np.zeros(0, np.int32)
    event_step = name_step[name_sorted] if len(name_sorted) else np.zeros(0, np.int64)
    event_autograd = (name_autograd[name_sorted] if len(name_sorted) else np.zeros(0, bool)) & (kind_sorted == 0)

    name_loop = [loop_marker(n) for n in names]
    main_thread = _main_thread(trace, nest, event_step, name_loop)
    process = trace.threads[main_thread].pid if trace.threads else 0
    process_threads = np.array([t.pid == process for t in trace.threads], dtype=bool)
    in_process = process_threads[nest.thread] if len(nest.thread) else np.zeros(0, bool)

    step_idx = np.flatnonzero((event_step >= 0) & (nest.thread == main_thread))
    if len(step_idx):
        steps = _steps(nest, step_idx, event_step, in_process)
    else:
        loop = _Loop(names, nest, main_thread, in_process, name_loop, name_autograd)
        steps = loop.steps() or _whole_trace(nest, in_process)
    is_step_event = np.zeros(len(nest.ts), dtype=bool)
    is_step_event[step_idx] = True
    top = (nest.parent < 0) | is_step_event[np.maximum(nest.parent, 0)] & (nest.parent >= 0)
    top &= ~is_step_event & in_process

    ctx = _Context(
        ranges=_Events(nest, np.flatnonzero((event_phase != NO_PHASE) & in_process & ~is_step_event), event_phase),
        autograd=_Events(nest, np.flatnonzero(event_autograd & in_process), event_phase),
        main_top=_Events(nest, np.flatnonzero(top & (nest.thread == main_thread)), event_phase, names=name_sorted),
        side_top=_Events(nest, np.flatnonzero(top & (nest.thread != main_thread)), event_phase),
        seed_code=_code_of(names, GRAD_SEED),
        name_autograd=name_autograd,
    )
    seg_start, seg_end, seg_phase, seg_step = [], [], [], []
    out_start, out_end, out_kind, out_step = [], [], [], []
    work = {code_of[FORWARD], code_of[BACKWARD], code_of[OPTIMIZER]}
    plain = _plain_steps(steps, ctx, code_of)
    ranged = _ranged_steps(steps, ctx, code_of, ~plain.is_plain)
    split = np.flatnonzero(~plain.is_plain & ~ranged.is_ranged).tolist()
    windows = zip(_step_ranges(steps, ctx, split, ranged), ctx.autograd.per_step(steps, split),
                  ctx.main_top.per_step(steps, split))
    for index, (w, autograd, top) in zip(split, windows):
        step = steps[index]
        for s, e, p in _eval_since_work(_split_step(step, ctx, code_of, w, autograd, top),
                                        code_of[OTHER], work):
            if p < NO_PHASE:
                out_start.append(s)
                out_end.append(e)
                out_kind.append(-2 - p)
                out_step.append(index)
                continue
            seg_start.append(s)
            seg_end.append(e)
            seg_phase.append(p)
            seg_step.append(index)
    for k in np.flatnonzero(plain.forward).tolist():
        steps[k].inferred.add(FORWARD)
    # every kind of step in step order, each step's segments in time order
    r = ranged
    seg_step = np.concatenate([np.array(seg_step, dtype=np.int32), plain.step, r.step])
    order = np.argsort(seg_step, kind="stable")
    out_step = np.concatenate([np.array(out_step, dtype=np.int32), r.apart_step])
    out_order = np.argsort(out_step, kind="stable")
    out_start = np.concatenate([np.array(out_start, dtype=np.float64), r.apart_start])[out_order]
    out_end = np.concatenate([np.array(out_end, dtype=np.float64), r.apart_end])[out_order]
    out_kind = np.concatenate([np.array(out_kind, dtype=np.int32), r.apart_kind])[out_order]
    out_step = out_step[out_order]
    _count_apart(steps, out_start, out_end, out_kind, out_step)
    if len(out_start):
        _uncount_apart(steps, nest.ts[in_process], out_start, out_end, out_step)
    return Partition(
        steps=steps,
        phases=phases,
        start=np.concatenate([np.array(seg_start, dtype=np.float64), plain.start, r.start])[order],
        end=np.concatenate([np.array(seg_end, dtype=np.float64), plain.end, r.end])[order],
        phase=np.concatenate([np.array(seg_phase, dtype=np.int32), plain.phase, r.phase])[order],
        step=seg_step[order],
        main_thread=main_thread,
        process_threads=process_threads,
        marker_names=(name_phase != NO_PHASE) | (name_step >= 0),
        apart_start=out_start,
        apart_end=out_end,
        apart_kind=out_kind,
        apart_step=out_step,
    )


def _eval_since_work(segments: list[Segment], other: int, work: set[int]) -> list[Segment]:
    """``segments`` of one step with the hook's rule for an evaluation pass applied: one that begins
    before the step's first training work (forward, backward, optimizer), right after ``other``
    time, also takes that time (the eval loader's first batch and ``model.eval()`` ran before the
    forward that opened the pass)."""
    code = apart_code(OUT_OF_STEP.index(EVAL))
    out: list[Segment] = []
    worked = False
    for s, e, p in segments:
        if p == code and not worked and out and out[-1][2] == other and out[-1][1] == s:
            s = out.pop()[0]
        if out and out[-1][2] == p and out[-1][1] == s:
            s = out.pop()[0]
        out.append((s, e, p))
        worked = worked or p in work
    return out


def _count_apart(steps: list[Step], start: np.ndarray, end: np.ndarray, kind: np.ndarray,
                 step: np.ndarray) -> None:
    """Add the time kept out of each step to `Step.apart`, segment by segment in time order."""
    for s, e, k, i in zip(start.tolist(), end.tolist(), kind.tolist(), step.tolist()):
        apart = steps[i].apart
        apart[OUT_OF_STEP[k]] = apart.get(OUT_OF_STEP[k], 0.0) + (e - s)


def _uncount_apart(steps: list[Step], process_ts: np.ndarray, start: np.ndarray, end: np.ndarray,
                   step: np.ndarray) -> None:
    """Take the events that start in time kept out of a step off that step's count: a window
    holding nothing but an evaluation pass is an empty step."""
    ts = np.sort(process_ts)
    inside = np.searchsorted(ts, end, "left") - np.searchsorted(ts, start, "left")
    for k, n in zip(step.tolist(), inside.tolist()):
        steps[k].events = max(steps[k].events - n, 0)


def _code_of(names: list[str], name: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        return -1


def _main_thread(trace: Trace, nest: Nesting, event_step: np.ndarray, name_loop: list[str | None]) -> int:
    """The thread that runs the training loop: the one with the step markers, else the one with
    the loop's marks (DataLoader, optimizer), else the busiest."""
    marked = nest.thread[event_step >= 0]
    if not len(marked) and len(nest.name):
        is_loop = np.array([k is not None for k in name_loop] or [False])
        marked = nest.thread[is_loop[nest.name]]
    if len(marked):
        return int(np.bincount(marked).argmax())
    if not len(nest.thread):
        return 0
    top = nest.parent < 0
    busy = np.bincount(nest.thread[top], weights=(nest.end - nest.ts)[top], minlength=len(trace.threads))
    return int(busy.argmax())


def _whole_trace(nest: Nesting, in_process: np.ndarray) -> list[Step]:
    """The whole trace as one step (a trace that marks no steps and repeats no loop marks)."""
    process_ts = nest.ts[in_process]
    if not len(process_ts):
        return []
    return [Step(number=0, start=float(process_ts.min()), end=float(nest.end[in_process].max()),
                 events=int(len(process_ts)))]


def _steps(nest: Nesting, step_idx: np.ndarray, event_step: np.ndarray, in_process: np.ndarray) -> list[Step]:
    """Step windows from the ``ProfilerStep#N`` markers."""
    process_ts = nest.ts[in_process]
    order = step_idx[np.argsort(nest.ts[step_idx], kind="stable")]
    start, end = nest.ts[order], nest.end[order]
    sorted_ts = np.sort(process_ts)
    # events starting inside each step, less the step's own marker
    inside = np.searchsorted(sorted_ts, end, "left") - np.searchsorted(sorted_ts, start, "left") - 1
    events = np.maximum(inside, 0).tolist()
    numbers = event_step[order].tolist()
    return [Step(k, a, b, c) for k, a, b, c in zip(numbers, start.tolist(), end.tolist(), events)]


class _Loop:
    """Steps inferred from the marks a training loop leaves once per iteration.

    The optimizer step ends an iteration: with two or more, an iteration starts at the first mark
    after an optimizer step of the loop's head kind (the kind of the trace's first mark, such as the
    DataLoader's next batch or ``zero_grad``; the kind after the first optimizer step when the trace
    starts with one) and runs to the next iteration's start; a head with no optimizer step after it
    (the ``__next__`` that ends the loop) only closes the previous step. Without optimizer steps
    (hand-written updates, inference), each repeat of the first repeated mark starts a step; with the
    gradient seed as that mark, a step starts at the loop thread's first op after the previous
    backward. Gradient accumulation keeps one step per optimizer step.
    """

    def __init__(self, names: list[str], nest: Nesting, main_thread: int, in_process: np.ndarray,
                 name_loop: list[str | None], name_autograd: np.ndarray):
        self.nest = nest
        self.in_process = in_process
        on_main = nest.thread == main_thread
        top = on_main & (nest.parent < 0)
        self.top_start = nest.ts[top]  # sorted: events are in (thread, start) order
        self.top_end = nest.end[top]
        is_loop = np.array([k is not None for k in name_loop] or [False])
        idx = np.flatnonzero(on_main & is_loop[nest.name]) if len(nest.name) else np.zeros(0, np.int64)
        marks = [(float(nest.ts[i]), float(nest.end[i]), name_loop[nest.name[i]]) for i in idx.tolist()]
        autograd = in_process & (nest.kind == OP) & name_autograd[nest.name] if len(nest.name) else on_main
        order = np.argsort(nest.ts[autograd], kind="stable")
        self.autograd_start = nest.ts[autograd][order]
        self.autograd_end = np.maximum.accumulate(nest.end[autograd][order]) if order.size else np.zeros(0)
        marks += [(s, e, LOOP_SEED) for s, e in self._seeds(names, top, name_autograd)]
        marks = _outermost(sorted(marks, key=lambda m: (m[0], -m[1])))
        counts = Counter(k for _, _, k in marks)
        self.marks = [m for m in marks if counts[m[2]] >= 2]
        self.has_steps = counts[LOOP_STEP] >= 2

    def _seeds(self, names: list[str], top: np.ndarray, name_autograd: np.ndarray) -> list[tuple[float, float]]:
        """Gradient seeds on the loop's thread that the autograd engine's work follows before the
        thread's next op."""
        if GRAD_SEED not in names or not len(self.autograd_start):
            return []
        seed_code = names.index(GRAD_SEED)
        name = self.nest.name[top]
        seed = name == seed_code
        callers = self.top_start[~seed & ~name_autograd[name]]
        starts, ends = self.top_start[seed], self.top_end[seed]
        nxt = np.searchsorted(callers, starts, "right")
        next_caller = np.where(nxt < len(callers), callers[np.minimum(nxt, len(callers) - 1)], np.inf)
        first = np.searchsorted(self.autograd_start, starts, "left")
        first_autograd = np.where(first < len(self.autograd_start),
                                  self.autograd_start[np.minimum(first, len(self.autograd_start) - 1)], np.inf)
        keep = first_autograd < next_caller
        return list(zip(starts[keep].tolist(), ends[keep].tolist()))

    def steps(self) -> list[Step]:
        if not self.marks:
            return []
        windows = self._by_optimizer_step() if self.has_steps else self._by_head()
        process_ts = np.sort(self.nest.ts[self.in_process])
        out = []
        for a, b in windows:
            if b <= a:  # a window that closes before it opens (marks out of order in a hostile trace): no step
                continue
            events = int(np.searchsorted(process_ts, b, "left") - np.searchsorted(process_ts, a, "left"))
            out.append(Step(number=len(out), start=a, end=b, events=events, inferred_step=True))
        return out

    def _by_optimizer_step(self) -> list[tuple[float, float]]:
        kinds = [k for _, _, k in self.marks]
        # A trace taken around the loop starts with an iteration's first mark; one that starts with
        # an optimizer step started mid-iteration, and what follows that step begins the next.
        head = kinds[0] if kinds[0] != LOOP_STEP else kinds[1]
        if head == LOOP_STEP:  # nothing but optimizer steps repeats: each ends a step
            ends = [e for _, e, k in self.marks if k == LOOP_STEP]
            return list(zip(ends[:-1], ends[1:]))
        starts: list[list] = []  # [start, end of its optimizer step or None]
        waiting = True
        for s, e, k in self.marks:
            if k == head and waiting:
                starts.append([s, None])
                waiting = False
            elif k == LOOP_STEP and starts:
                starts[-1][1] = e
                waiting = True
        windows = []
        for i, (start, step_end) in enumerate(starts):
            if step_end is None:
                continue
            windows.append((start, starts[i + 1][0] if i + 1 < len(starts) else step_end))
        return windows

    def _by_head(self) -> list[tuple[float, float]]:
        head = self.marks[0][2]
        heads = [(s, e) for s, e, k in self.marks if k == head]
        if head == LOOP_SEED:  # a step starts with the first op after the previous backward
            starts = [float(self.top_start[0])]
            for s, _ in heads[1:]:
                done = self.autograd_end[max(int(np.searchsorted(self.autograd_start, s, "left")) - 1, 0)]
                after = int(np.searchsorted(self.top_start, done, "left"))
                starts.append(float(self.top_start[after]) if after < len(self.top_start) else s)
        else:
            starts = [s for s, _ in heads]
        last = float(self.top_end.max())
        windows = list(zip(starts, starts[1:] + [last]))
        # the last head alone (the DataLoader's final __next__ that ends the loop) is no step
        a, b = windows[-1]
        inside = np.searchsorted(self.top_start, b, "left") - np.searchsorted(self.top_start, a, "left")
        if inside <= 1:
            windows.pop()
        return windows


def _outermost(marks: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The marks not inside another (sorted by start, the longer first): a wrapped optimizer's step runs the inner
    optimizer's step inside its own, and both are marked; the iteration has one."""
    out: list[tuple[float, float, str]] = []
    reach = -np.inf
    for m in marks:
        if out and m[1] <= reach:
            continue
        out.append(m)
        reach = max(reach, m[1])
    return out


class _Events:
    """A subset of host events sorted by start, for slicing by step window."""

    def __init__(self, nest: Nesting, idx: np.ndarray, event_phase: np.ndarray, names: np.ndarray | None = None):
        idx = idx[np.argsort(nest.ts[idx], kind="stable")]
        self.start = nest.ts[idx]
        self.end = nest.end[idx]
        self.phase = event_phase[idx]
        self.name = names[idx] if names is not None else None

    def window(self, start: float, end: float) -> slice:
        return slice(int(np.searchsorted(self.start, start, "left")), int(np.searchsorted(self.start, end, "left")))

    def per_step(self, steps: list[Step], which: list[int]) -> list[slice]:
        """The events starting within each step of ``which`` (one vectorised search for all)."""
        lo = np.searchsorted(self.start, [steps[k].start for k in which], "left").tolist()
        hi = np.searchsorted(self.start, [steps[k].end for k in which], "left").tolist()
        return [slice(a, b) for a, b in zip(lo, hi)]


class _Plain(msgspec.Struct):
    """The segments of the plain steps, found for all of them at once (see `_plain_steps`)."""

    is_plain: np.ndarray  # bool per step
    forward: np.ndarray  # bool per step: a plain step whose forward was inferred
    start: np.ndarray  # the segments: float64 µs
    end: np.ndarray
    phase: np.ndarray  # int32
    step: np.ndarray  # int32 index into the steps


class _Context(msgspec.Struct):
    ranges: _Events  # phase ranges
    autograd: _Events  # ops run by the autograd engine
    main_top: _Events  # top-level events of the loop's thread within a step
    side_top: _Events  # top-level events of the process's other threads
    seed_code: int
    name_autograd: np.ndarray


def _plain_steps(steps: list[Step], ctx: _Context, code_of: dict[str, int]) -> _Plain:
    """The steps that no phase range overlaps and no autograd op starts in, split all at once.

    `_split_step` makes a few numpy calls per step, far above the work of a step with almost
    nothing in it (50,000 of them took seconds). A plain step's split needs none of its rules but
    one: its forward is the top-level work of the loop's thread, from the first work's start to
    the last work's end (or the step's end), the rest ``other`` — what `_split_step` gives it."""
    n = len(steps)
    a = np.array([s.start for s in steps], dtype=np.float64)
    b = np.array([s.end for s in steps], dtype=np.float64)
    # a range overlaps [a, b) if it starts before b and one begun so far ends after a
    reach = np.maximum.accumulate(ctx.ranges.end) if len(ctx.ranges.end) else np.zeros(0)
    before_end = np.searchsorted(ctx.ranges.start, b, "left")
    ranged = ((before_end > 0) & (reach[np.maximum(before_end - 1, 0)] > a) if len(reach)
              else np.zeros(n, bool))
    ag = ctx.autograd.start
    is_plain = ~ranged & (np.searchsorted(ag, b, "left") == np.searchsorted(ag, a, "left"))
    top = ctx.main_top
    top_autograd = ctx.name_autograd[top.name] if len(top.name) else np.zeros(0, bool)
    work = np.flatnonzero(~top_autograd & (top.phase == NO_PHASE) & (top.name != ctx.seed_code))
    work_start, work_end = top.start[work], top.end[work]
    lo = np.searchsorted(work_start, a, "left")
    hi = np.searchsorted(work_start, b, "left")
    # the work of each step: [lo, hi), disjoint and in order while the steps are; else none plain
    has = is_plain & (hi > lo)
    bounds = np.stack([lo[has], hi[has]], axis=1).ravel()
    if len(bounds) and np.any(np.diff(bounds) < 0):
        is_plain[:] = False
        has[:] = False
        bounds = bounds[:0]
    fs = np.full(n, np.inf)
    fe = np.full(n, -np.inf)
    if len(bounds):
        fs[has] = work_start[lo[has]]
        fe[has] = np.maximum.reduceat(np.r_[work_end, -np.inf], bounds)[::2]
    fe_in = np.minimum(fe, b)
    forward = has & (fe_in > fs)  # zero-length work marks a forward but holds no time
    # up to three segments a step: other before the forward, the forward, other after it
    seg_start = np.stack([a, fs, fe], axis=1)
    seg_end = np.stack([fs, fe_in, b], axis=1)
    codes = np.array([code_of[OTHER], code_of[FORWARD], code_of[OTHER]], np.int32)
    seg_phase = np.tile(codes, (n, 1))
    keep = np.stack([forward & (fs > a), forward, forward & (fe < b)], axis=1)
    whole = is_plain & ~forward & (b > a)  # one ``other`` segment over the whole step
    seg_start[whole, 0], seg_end[whole, 0], keep[whole, 0] = a[whole], b[whole], True
    keep &= is_plain[:, None]
    seg_step = np.broadcast_to(np.arange(n, dtype=np.int32)[:, None], (n, 3))
    return _Plain(is_plain=is_plain, forward=has, start=seg_start[keep], end=seg_end[keep],
                  phase=seg_phase[keep], step=seg_step[keep])


#: A step holding more phase ranges than this goes through `_split_step`: `_ranged_steps` compares
#: each of a step's elementary intervals with each of its ranges.
DENSE = 16
#: Elements compared at once by `_ranged_steps` (intervals times ranges a step): bounds its memory.
CHUNK = 1 << 20


class _Ranged(msgspec.Struct):
    """The steps that `_ranged_steps` split all at once, their segments (time kept out of the steps
    apart), and the phase ranges each step holds (``None`` where steps overlap or are out of order:
    then `_step_ranges` follows the ranges open from step to step)."""

    is_ranged: np.ndarray  # bool per step
    start: np.ndarray  # the segments: float64 µs, in step order, each step's in time order
    end: np.ndarray
    phase: np.ndarray  # int32
    step: np.ndarray  # int32 index into the steps
    apart_start: np.ndarray  # the time kept out of those steps, in the same order
    apart_end: np.ndarray
    apart_kind: np.ndarray  # int32 index into OUT_OF_STEP
    apart_step: np.ndarray  # int32
    pair_step: np.ndarray | None  # int64: each (step, phase range) that overlap, by step then range
    pair_range: np.ndarray | None  # int64 index into ctx.ranges


def _ranged_steps(steps: list[Step], ctx: _Context, code_of: dict[str, int],
                  candidate: np.ndarray) -> _Ranged:
    """The ``candidate`` steps whose phases need no inference from the ops (a forward range, and a
    backward range or no autograd op), split all at once: what `_split_step` gives them.

    A step's phase ranges are those starting in its window and those begun in an earlier step's (or
    before the first) still open; each instant takes the best range covering it (`_innermost`'s
    order: time kept out first, then the later start, the earlier end, the earlier range). Over
    all steps at once: the elementary intervals of every step by one sort, each compared with the
    ranges of its step (at most `DENSE`), then runs of one phase merged and `_eval_since_work`'s
    rule applied to the runs."""
    n = len(steps)
    a = np.array([s.start for s in steps], dtype=np.float64)
    b = np.array([s.end for s in steps], dtype=np.float64)
    f64, i32 = np.zeros(0), np.zeros(0, np.int32)
    if not n or np.any(a[1:] < b[:-1]):  # steps that overlap: `_split_step` for each, in turn
        return _Ranged(np.zeros(n, bool), f64, f64, i32, i32, f64, f64, i32, i32, None, None)
    # every (step, range) whose clipped window holds time
    rs, re = ctx.ranges.start, ctx.ranges.end
    home = np.searchsorted(a, rs, "right") - 1
    begun = (home < 0) | (rs < b[np.maximum(home, 0)])  # in a step's window or before the first
    first = np.maximum(home, 0)
    count = np.where(begun, np.maximum(np.searchsorted(a, re, "left") - first, 0), 0)
    pair_range = np.repeat(np.arange(len(rs)), count)
    offset = np.arange(len(pair_range)) - np.repeat(np.cumsum(count) - count, count)
    pair_step = np.repeat(first, count) + offset
    ps = np.maximum(rs[pair_range], a[pair_step])
    pe = np.minimum(re[pair_range], b[pair_step])
    keep = np.flatnonzero(pe > ps)
    keep = keep[np.lexsort((pair_range[keep], pair_step[keep]))]
    pair_range, pair_step, ps, pe = pair_range[keep], pair_step[keep], ps[keep], pe[keep]
    pp = ctx.ranges.phase[pair_range]
    held = np.bincount(pair_step, minlength=n)
    marks_forward = np.bincount(pair_step[pp == code_of[FORWARD]], minlength=n) > 0
    marks_backward = np.bincount(pair_step[pp == code_of[BACKWARD]], minlength=n) > 0
    ag = ctx.autograd.start
    no_autograd = np.searchsorted(ag, b, "left") == np.searchsorted(ag, a, "left")
    is_ranged = candidate & marks_forward & (marks_backward | no_autograd) & (held <= DENSE)
    if not is_ranged.any():
        return _Ranged(is_ranged, f64, f64, i32, i32, f64, f64, i32, i32, pair_step, pair_range)
    sel = is_ranged[pair_step]
    qs, qe, qp, qk, qr = ps[sel], pe[sel], pp[sel], pair_step[sel], pair_range[sel]
    ranged = np.flatnonzero(is_ranged)
    # the elementary intervals of every step: its bounds and its ranges' ends, sorted, distinct
    point = np.concatenate([a[ranged], b[ranged], qs, qe])
    point_step = np.concatenate([ranged, ranged, qk, qk])
    o = np.lexsort((point, point_step))
    point, point_step = point[o], point_step[o]
    distinct = np.r_[True, (point_step[1:] != point_step[:-1]) | (point[1:] != point[:-1])]
    point, point_step = point[distinct], point_step[distinct]
    iv = np.flatnonzero(point_step[1:] == point_step[:-1])
    lo, hi, k = point[iv], point[iv + 1], point_step[iv]
    # rank of each range in its step, best first
    rank = np.empty(len(qs), np.int64)
    rank[np.lexsort((qr, qe, -qs, np.where(qp < NO_PHASE, 0, 1), qk))] = np.arange(len(qs))
    phase_of_rank = np.empty(len(qs), np.int32)
    phase_of_rank[rank] = qp
    held_sel = np.bincount(qk, minlength=n)
    first_pair = np.cumsum(held_sel) - held_sel
    width = 1 << np.ceil(np.log2(np.maximum(held_sel[k], 1))).astype(np.int64)
    phase = np.full(len(lo), code_of[OTHER], np.int32)
    for w in np.unique(width).tolist():
        rows = np.flatnonzero(width == w)
        for c in range(0, len(rows), max(CHUNK // w, 1)):
            r = rows[c:c + max(CHUNK // w, 1)]
            slot = np.arange(w)
            pair = np.minimum(first_pair[k[r], None] + slot, max(len(qs) - 1, 0))
            cover = ((slot < held_sel[k[r], None]) & (qs[pair] <= lo[r, None])
                     & (qe[pair] >= hi[r, None]))
            best = np.where(cover, rank[pair], len(qs)).min(axis=1)
            covered = best < len(qs)
            phase[r[covered]] = phase_of_rank[best[covered]]
    lo, hi, k, phase = _runs(lo, hi, k, phase)
    # an evaluation pass before the step's first work takes the ``other`` time just before it
    is_work = np.isin(phase, [code_of[FORWARD], code_of[BACKWARD], code_of[OPTIMIZER]])
    done = np.cumsum(is_work) - is_work  # work segments before each, over all steps
    step_first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    done -= done[step_first[np.cumsum(np.r_[True, k[1:] != k[:-1]]) - 1]]
    eval_code = apart_code(OUT_OF_STEP.index(EVAL))
    takes = np.flatnonzero((phase[:-1] == code_of[OTHER]) & (phase[1:] == eval_code)
                           & (k[1:] == k[:-1]) & (done[1:] == 0))
    phase[takes] = eval_code
    lo, hi, k, phase = _runs(lo, hi, k, phase)
    out = phase < NO_PHASE
    return _Ranged(is_ranged=is_ranged, start=lo[~out], end=hi[~out], phase=phase[~out],
                   step=k[~out].astype(np.int32), apart_start=lo[out], apart_end=hi[out],
                   apart_kind=(-2 - phase[out]).astype(np.int32),
                   apart_step=k[out].astype(np.int32), pair_step=pair_step, pair_range=pair_range)


def _runs(lo: np.ndarray, hi: np.ndarray, step: np.ndarray,
          phase: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Adjacent intervals of one step and phase (in step and time order, each step's contiguous)
    merged into one segment."""
    head = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (phase[1:] != phase[:-1])])
    tail = np.r_[head[1:], len(lo)] - 1
    return lo[head], hi[tail], step[head], phase[head]


def _step_ranges(steps: list[Step], ctx: _Context, split: list[int], ranged: _Ranged):
    """The phase ranges (indices into ``ctx.ranges``, in order) of each step of ``split``: those
    begun in it, and those begun in an earlier step, or before the first, still open. Lightning's
    PyTorchProfiler cuts its steps inside the optimizer's step, whose range runs on into the
    next."""
    if ranged.pair_step is not None:
        lo = np.searchsorted(ranged.pair_step, split, "left").tolist()
        hi = np.searchsorted(ranged.pair_step, split, "right").tolist()
        for a, b in zip(lo, hi):
            yield ranged.pair_range[a:b]
        return
    # steps that overlap or are out of order: the ranges still open, step after step
    begun = int(np.searchsorted(ctx.ranges.start, steps[0].start, "left")) if steps else 0
    running_on = np.arange(begun)
    opened = np.maximum.accumulate(np.array([s.start for s in steps], dtype=np.float64))
    for index, ranges in zip(split, ctx.ranges.per_step(steps, split)):
        # the plain steps skipped since hold no phase range: only their starts close ranges
        running_on = running_on[ctx.ranges.end[running_on] > opened[index]]
        yield np.concatenate([running_on, np.arange(ranges.start, ranges.stop)])
        still = ranges.start + np.flatnonzero(ctx.ranges.end[ranges] > steps[index].end)
        running_on = np.concatenate([running_on, still])


def _split_step(step: Step, ctx: _Context, code_of: dict[str, int], w: np.ndarray, autograd: slice,
                top: slice) -> list[Segment]:
    """Phase segments ``(start, end, phase code)`` covering ``step`` without gaps; ``w``,
    ``autograd`` and ``top`` select the step's phase ranges, autograd ops and top-level events.
    The phase ranges include those begun in an earlier step and still open: Lightning's
    PyTorchProfiler cuts its steps inside the optimizer's step, whose range runs on into the next."""
    a, b = step.start, step.end
    ranges = [
        (max(s, a), min(e, b), int(p), APART if p < NO_PHASE else EXPLICIT)
        for s, e, p in zip(ctx.ranges.start[w].tolist(), ctx.ranges.end[w].tolist(), ctx.ranges.phase[w].tolist())
        if min(e, b) > max(s, a)
    ]
    marked = {p for _, _, p, _ in ranges}
    forward, backward = code_of[FORWARD], code_of[BACKWARD]
    top_start = ctx.main_top.start[top]
    top_end = ctx.main_top.end[top]
    top_name = ctx.main_top.name[top]
    top_is_range = ctx.main_top.phase[top] != NO_PHASE
    top_autograd = ctx.name_autograd[top_name] if len(top_name) else np.zeros(0, bool)

    backward_segments = [(s, e) for s, e, p, _ in ranges if p == backward]
    if backward not in marked:
        backward_segments = _infer_backward(a, b, ctx, autograd, top_start, top_name, top_autograd)
        if backward_segments:
            step.inferred.add(BACKWARD)
            ranges += [(s, e, backward, INFERRED) for s, e in backward_segments]
    if forward not in marked:
        separators = sorted([(s, e) for s, e, p, _ in ranges if p != forward] + backward_segments)
        work = ~top_autograd & ~top_is_range & (top_name != ctx.seed_code)
        forward_segments = _infer_forward(a, top_start[work], top_end[work], separators, backward_segments)
        if forward_segments:
            step.inferred.add(FORWARD)
            ranges += [(s, e, forward, INFERRED) for s, e in forward_segments]
    return _innermost(a, b, ranges, code_of[OTHER])


def _infer_backward(a: float, b: float, ctx: _Context, w: slice, top_start: np.ndarray, top_name: np.ndarray,
                    top_autograd: np.ndarray) -> list[Interval]:
    ag_start = ctx.autograd.start[w]
    if not len(ag_start):
        return []
    ag_end = np.maximum.accumulate(ctx.autograd.end[w])
    # What the loop's thread does between autograd ops (other than the gradient seed) splits segments:
    # that is forward work of the next micro-batch under gradient accumulation.
    caller = ~top_autograd & (top_name != ctx.seed_code)
    caller_start = top_start[caller]
    first = [0]
    if len(ag_start) > 1:
        lo = np.searchsorted(caller_start, ag_end[:-1], "right")
        hi = np.searchsorted(caller_start, ag_start[1:], "left")
        first += (np.flatnonzero(hi > lo) + 1).tolist()
    segments = []
    previous_end = a
    for k0, k1 in zip(first, first[1:] + [len(ag_start)]):
        k1 -= 1
        start = float(ag_start[k0])
        # The seed: the loop thread's last top-level op before the engine starts.
        before = int(np.searchsorted(top_start, start, "left")) - 1
        if before >= 0 and top_name[before] == ctx.seed_code and top_start[before] >= previous_end:
            start = float(top_start[before])
        # The caller resumes at its first op after the last autograd op started.
        after = int(np.searchsorted(caller_start, ag_start[k1], "right"))
        resume = float(caller_start[after]) if after < len(caller_start) else b
        end = float(ag_end[k1])
        side = ctx.side_top.window(start, resume)
        if side.stop > side.start:
            end = max(end, float(ctx.side_top.end[side].max()))
        end = min(end, resume, b)
        if end > start:
            segments.append((start, end))
            previous_end = end
    return segments


def _infer_forward(a: float, work_start: np.ndarray, work_end: np.ndarray,
                   separators: list[Interval], backward_segments: list[Interval]) -> list[Interval]:
    """Top-level host work between the other phases, up to the step's last backward segment (what
    follows it, such as ``loss.item()`` or logging, stays ``other``). A segment that runs into a
    backward segment extends to its start: the loss and the call into ``backward()`` lie between."""
    if not len(work_start):
        return []
    limit = backward_segments[-1][0] if backward_segments else float("inf")
    backward_starts = {s for s, _ in backward_segments}
    segments = []
    lo = a
    for s, e in _union(separators) + [(float("inf"), float("inf"))]:
        hi = min(s, limit)
        i = int(np.searchsorted(work_start, lo, "left"))
        j = int(np.searchsorted(work_start, hi, "left"))
        if j > i:
            end = hi if s in backward_starts else float(min(work_end[i:j].max(), hi))
            segments.append((float(work_start[i]), end))
        if s >= limit:
            break
        lo = max(lo, e)
    return segments


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _innermost(a: float, b: float, ranges: list[tuple[float, float, int, int]], other: int) -> list[Segment]:
    """Sweep [a, b): each elementary interval takes the phase of the innermost covering range —
    the one that started last (ties: the shorter), ranges from the trace before inferred ones.

    One pass over the sorted end points with a heap of the ranges open so far, best first; ranges
    that ended are dropped when they surface at the top: O(n log n) in the number of ranges."""
    points = sorted({a, b, *[s for s, _, _, _ in ranges], *[e for _, e, _, _ in ranges]})
    points = [p for p in points if a <= p <= b]
    # Heap entries order best first: higher tier, later start, earlier end, then list order.
    opening = sorted(((-tier, -s, e, i, p) for i, (s, e, p, tier) in enumerate(ranges) if e > s),
                     key=lambda entry: -entry[1])
    heap: list[tuple[int, float, float, int, int]] = []
    j = 0
    segments: list[Segment] = []
    for lo, hi in zip(points, points[1:]):
        if hi <= lo:
            continue
        while j < len(opening) and -opening[j][1] <= lo:
            heapq.heappush(heap, opening[j])
            j += 1
        while heap and heap[0][2] <= lo:  # ended: no longer covers anything from here on
            heapq.heappop(heap)
        phase = heap[0][4] if heap else other
        if segments and segments[-1][2] == phase and segments[-1][1] == lo:
            segments[-1] = (segments[-1][0], hi, phase)
        else:
            segments.append((lo, hi, phase))
    return segments
