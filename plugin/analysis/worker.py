"""One worker's profiled steps, analysed once: what every answer about a worker is derived from.

A worker's spans (one `SpanAnalysis` per trace file) are put in step order and their per-phase
tables aligned on one phase list, once. Step rows, a step's detail, summaries, comparisons and
the rank table are then pure functions of this `Worker`, and TensorBoard caches it per worker
until one of its spans changes.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from phaseprof.contract import COMPILE, OUT_OF_STEP, PHASES

from .blocking import Blocked, mean_blocking
from .model import SpanAnalysis
from .warmup import setup_us, warmup

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)

#: Columns of `Worker.op_means`: calls, self host µs, host µs, self GPU µs, GPU µs per step.
OP_COLUMNS = ("calls", "self_cpu", "cpu", "self_gpu", "gpu")


class StepRef(msgspec.Struct, frozen=True):
    """Where one step of a worker lives: its span and its index there."""

    span: SpanAnalysis
    index: int


class Worker:
    """A worker's steps in step-number order, with per-phase tables of ``len(refs)`` rows by
    ``phases`` columns (phases aligned by name across spans)."""

    def __init__(self, name: str, spans: list[SpanAnalysis]):
        self.name = name
        self.spans = spans
        self.phases = phase_names(spans)
        refs = [StepRef(span, i) for span in spans for i in range(len(span.steps))]
        refs.sort(key=lambda r: (r.span.steps[r.index].number, r.span.steps[r.index].start))
        self.refs = refs
        first = {}  # a span listed twice is one span
        for k, span in enumerate(spans):
            first.setdefault(id(span), k)
        self._span_of = np.array([first[id(r.span)] for r in refs], dtype=np.int64)
        self._index = np.array([r.index for r in refs], dtype=np.int64)
        steps = [r.span.steps[r.index] for r in refs]
        self.numbers = [s.number for s in steps]
        self.wall_us = np.array([s.wall for s in steps], dtype=np.float64)
        #: (steps, kinds of OUT_OF_STEP) host and device µs in each step's window kept out of the step
        self.apart_us = np.array([[s.apart.get(k, 0.0) for k in OUT_OF_STEP] for s in steps],
                                   dtype=np.float64).reshape(len(steps), len(OUT_OF_STEP))
        self._every_span = self.by_span(range(len(refs)))  # every row, grouped by span once
        self.apart_gpu_us = self._per_step("apart_gpu_us", (len(OUT_OF_STEP),))
        self.empty = np.array([s.empty for s in steps], dtype=bool)
        self.on_gpu = np.array([r.span.has_gpu for r in refs], dtype=bool)
        self.has_gpu = any(s.has_gpu for s in spans)
        self.host_us = self._gather("host_us")
        self.gpu_us = self._gather("gpu_us")
        # a phase a span lacks had no host time there, so no idle time either (NaN only without GPU)
        self.gpu_idle_us = self._gather("gpu_idle_us")
        self.compute_idle_us = self._gather("compute_idle_us")
        self.launches = self._gather("launches")
        self.wait_us = self._gather("wait_us")
        #: GPU busy, compute, communication and exposed communication per step and phase (`GpuMeasures`)
        self.gpu_busy_us = self._gather("gpu.busy_us")
        self.gpu_compute_us = self._gather("gpu.compute_us")
        self.comm_us = self._gather("gpu.comm_us")
        self.exposed_comm_us = self._gather("gpu.exposed_us")
        #: copies and sets (busy, and with neither compute nor communication running) per step and
        #: phase
        self.memory_us = self._gather("gpu.memory_us")
        self.exposed_memory_us = self._gather("gpu.memory_exposed_us")
        self.untraced_us = self._gather("untraced_us")
        #: launched work not yet started, all streams, summed over each phase's host time (queue-µs)
        self.queued_us = self._gather("queues.phase_queued_us")
        self.step_gpu_idle_us = self._per_step("step_gpu_idle_us")
        #: kernel time (summed over streams), GPU window and how far the GPU work outlasts the host window
        self.kernel_us = self._per_step("step_gpu_us")
        self.gpu_window_us = self._per_step("gpu.window_us")
        self.past_host_us = self._per_step("gpu.past_host_us")
        #: Steps in which torch.compile compiled (their ``compile`` phase took time).
        self.compiling = (self.host_us[:, self.phases.index(COMPILE)] > 0 if COMPILE in self.phases
                          else np.zeros(len(refs), dtype=bool))
        #: Host µs of one-off setup calls per step, and the steps whose time went to them (`warmup`).
        self.setup_us = np.concatenate([setup_us(s) for s in spans])[self._span_order()] if refs else np.zeros(0)
        #: The last step of a trace the trace's end cut (`cut`).
        self.cut = np.array([bool(r.span.cut[r.index]) for r in refs], dtype=bool)
        full = self.full()
        self.warmup = warmup(self.wall_us, self.setup_us, np.array([r.index == 0 for r in refs], dtype=bool),
                             full[~(self.compiling[full] | self.cut[full])])
        self.loader = _loader(spans)
        self.rank = rank_of(name, spans)
        self.world_size = next((s.world_size for s in spans if s.world_size is not None), None)
        with_gpus = next((s for s in spans if s.gpu_names), None)
        self.gpu_names = with_gpus.gpu_names if with_gpus else []
        self.gpu_capabilities = with_gpus.gpu_capabilities if with_gpus else []
        self.cpus = next((s.cpus for s in spans if s.cpus), None)

    def _gather(self, table: str) -> np.ndarray:
        """A (steps, phases) table of the spans (``table`` may be dotted: ``gpu.busy_us``), aligned on
        this worker's phases; a phase a span lacks is 0 there (NaN in a span whose table is NaN
        throughout: figures that do not exist, as GPU idle without GPU)."""
        out = np.zeros((len(self.refs), len(self.phases)), dtype=np.float64)
        for span, at, index in self._every_span:
            values = _table(span, table)
            if values.size and np.isnan(values).all():
                out[at] = np.nan
            # phases without time anywhere are not listed (nor gathered)
            kept = [j for j, p in enumerate(span.phases) if p in self.phases]
            columns = [self.phases.index(span.phases[j]) for j in kept]
            out[np.ix_(at, columns)] = values[np.ix_(index, kept)]
        return out

    def _per_step(self, table: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """The spans' per-step ``table`` (a step's row: of ``shape``) for every row of this worker
        (``table`` may be dotted), one copy per span rather than one numpy call per step."""
        out = np.zeros((len(self.refs), *shape), dtype=np.float64)
        for span, at, index in self._every_span:
            out[at] = _table(span, table)[index]
        return out

    def streams(self, row: int) -> dict[str, float]:
        """GPU busy µs per stream of step ``row`` (streams with work in it)."""
        ref = self.refs[row]
        g = ref.span.gpu
        busy = g.stream_busy_us[ref.index] if len(g.streams) else np.zeros(0)
        return {label: float(v) for label, v in zip(g.streams, busy.tolist()) if v > 0}

    def idle_split(self, row: int) -> dict[str, np.ndarray]:
        """Per stream of step ``row`` with idle time in it: µs of host wait, kernel wait, other."""
        ref = self.refs[row]
        g = ref.span.gpu
        split = g.idle_split_us[ref.index] if len(g.streams) else np.zeros((0, 3))
        return {label: v for label, v in zip(g.streams, split) if v.any()}

    def memory_kinds(self, row: int) -> dict[str, float]:
        """Device µs per kind of copy or set (its name) of step ``row``."""
        ref = self.refs[row]
        g = ref.span.gpu
        us = g.memory_kind_us[ref.index].tolist()
        return {k: float(v) for k, v in zip(g.memory_kinds, us) if v > 0}

    def by_span(self, rows) -> list[tuple[SpanAnalysis, list[int], list[int]]]:
        """``rows`` grouped by span, in order of each span's first row: (span, the rows, their step
        indices in the span). One sort for all rows: callers pass every step of the worker."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if not len(rows):
            return []
        which = self._span_of[rows]
        order = np.argsort(which, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(which[order])) + 1)
        groups.sort(key=lambda g: int(g[0]))
        return [(self.spans[int(which[g[0]])], rows[g].tolist(), self._index[rows[g]].tolist())
                for g in groups]

    def row_of(self, number: int) -> int | None:
        """The row of step ``number``, or None."""
        return next((k for k, n in enumerate(self.numbers) if n == number), None)

    def full(self) -> np.ndarray:
        """The rows of the steps holding work (summaries and comparisons leave empty ones out)."""
        return np.flatnonzero(~self.empty)

    def steady(self) -> np.ndarray:
        """The rows a summary, the gate and the rank table stand for: the steps holding work less those
        that compiled (as the training side's summary leaves them out), the warm-up steps (`warmup`)
        and a last step the trace's end cut (`cut`); all steps holding work when none is left."""
        full = self.full()
        steady = full[~(self.compiling[full] | self.warmup[full] | self.cut[full])]
        return steady if len(steady) else full

    def run_wide(self, rows: list[int]) -> tuple[list[int], list[int], str | None]:
        """``rows`` as a run-wide table (operators, kernels, modules, memory) takes them: less the steps
        the summary leaves out (`steady`: compiling, warm-up and cut steps), with the numbers of those
        left out and one sentence saying why (None when none is)."""
        steady = set(self.steady().tolist())
        kept = [k for k in rows if k in steady]
        out = [k for k in rows if k not in steady and not self.empty[k]]
        if not out:
            return kept, [], None
        parts = [f"{'steps' if len(ks) > 1 else 'step'} {', '.join(str(self.numbers[k]) for k in ks)} {why}"
                 for why, ks in (("compiled", [k for k in out if self.compiling[k]]),
                                 ("warmed up", [k for k in out if self.warmup[k] and not self.compiling[k]]),
                                 ("cut by the trace's end",
                                  [k for k in out if self.cut[k] and not (self.compiling[k] or self.warmup[k])]))
                 if ks]
        return kept, [self.numbers[k] for k in out], (
            f"{' and '.join(parts)}: left out, as the summary's means and findings leave them out")

    def _span_order(self) -> np.ndarray:
        """Position of each row in the spans' steps laid end to end (span by span)."""
        offsets = np.cumsum([0] + [len(s.steps) for s in self.spans])
        at = {id(s): int(o) for s, o in zip(self.spans, offsets.tolist())}
        return np.array([at[id(r.span)] + r.index for r in self.refs], dtype=np.int64)

    def columns(self, phases: list[str]) -> np.ndarray:
        """Column of each of ``phases`` in this worker's tables; -1 where it has no such phase."""
        return np.array([self.phases.index(p) if p in self.phases else -1 for p in phases], dtype=np.int64)

    def phase_means(self, rows: np.ndarray, phases: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Mean host and GPU µs per phase of ``phases`` over ``rows`` (0 for a phase it lacks)."""
        n = max(len(rows), 1)
        cols = self.columns(phases)
        cpu = np.where(cols >= 0, self.host_us[rows].sum(axis=0)[cols] / n, 0.0) if len(phases) else np.zeros(0)
        gpu = np.where(cols >= 0, self.gpu_us[rows].sum(axis=0)[cols] / n, 0.0) if len(phases) else np.zeros(0)
        return cpu, gpu

    def op_means(self, rows: np.ndarray) -> dict[tuple[str, str], np.ndarray]:
        """(phase, op name) -> the `OP_COLUMNS` per step, averaged over ``rows``."""
        return self._means(rows, lambda span: span.ops,
                           lambda t: (t.calls, t.self_us, t.total_us, t.self_gpu_us, t.gpu_us))

    def kernel_means(self, rows: np.ndarray) -> dict[tuple[str, str], np.ndarray]:
        """(phase, kernel name) -> [launches, device µs] per step, averaged over ``rows``."""
        return self._means(rows, lambda span: span.kernels, lambda t: (t.calls, t.us))

    def _means(self, rows: np.ndarray, table_of, columns_of) -> dict[tuple[str, str], np.ndarray]:
        """(phase, name) -> ``columns_of(table)`` per step, averaged over ``rows``, of the per-step
        table (``table_of(span)``: rows with ``step``, ``phase`` and ``name`` codes) of every span."""
        totals: dict[tuple[str, str], np.ndarray] = {}
        for span, _, indices in self.by_span(rows.tolist()):
            t = table_of(span)
            picked = np.isin(t.step, indices)
            key = t.phase[picked].astype(np.int64) * len(span.names) + t.name[picked]
            groups, inverse = np.unique(key, return_inverse=True)
            sums = np.stack([np.bincount(inverse.ravel(), weights=c[picked], minlength=len(groups))
                             for c in columns_of(t)], axis=1)
            for g, k in enumerate(groups.tolist()):
                name = (span.phases[k // len(span.names)], span.names[k % len(span.names)])
                totals[name] = totals[name] + sums[g] if name in totals else sums[g].copy()
        n = max(len(rows), 1)
        return {k: v / n for k, v in totals.items()}

    def blocking_means(self, rows: np.ndarray) -> list[Blocked]:
        """The host calls that waited for the device in ``rows``, grouped, per step (`blocking`)."""
        spans = [(span, indices) for span, _, indices in self.by_span(rows.tolist())]
        return mean_blocking(spans, len(rows))

    def collective_us(self, rows: np.ndarray, phases: list[str], is_collective) -> np.ndarray:
        """Per step of ``rows`` and phase of ``phases``, the time spent in ops ``is_collective(name)``
        picks: their host self time, or the device time of the work they launched, whichever is larger."""
        host = np.zeros((len(rows), len(phases)))
        device = np.zeros((len(rows), len(phases)))
        position = {int(r): k for k, r in enumerate(rows.tolist())}
        for span, at, indices in self.by_span(rows.tolist()):
            t = span.ops
            collective = np.array([bool(is_collective(n)) for n in span.names] or [False])
            picked = np.isin(t.step, indices) & collective[t.name]
            row_of_step = dict(zip(indices, (position[a] for a in at)))
            to_row = np.array([row_of_step[int(i)] for i in t.step[picked].tolist()], dtype=np.int64)
            to_phase = np.array([phases.index(p) if p in phases else -1 for p in span.phases])[t.phase[picked]]
            listed = to_phase >= 0
            np.add.at(host, (to_row[listed], to_phase[listed]), t.self_us[picked][listed])
            np.add.at(device, (to_row[listed], to_phase[listed]), t.self_gpu_us[picked][listed])
        return np.maximum(host, device)


def _table(span: SpanAnalysis, table: str) -> np.ndarray:
    """The array ``table`` of ``span`` (dotted: ``gpu.busy_us``)."""
    values = span
    for part in table.split("."):
        values = getattr(values, part)
    return values


def _loader(spans: list[SpanAnalysis]) -> str | None:
    """How the loop's DataLoader loads batches, as its iterator's name in the trace says."""
    names = {n for s in spans for n in s.names if n.startswith("enumerate(DataLoader)#")}
    if any("_MultiProcessingDataLoaderIter" in n for n in names):
        return "worker processes"
    if any("_SingleProcessDataLoaderIter" in n for n in names):
        return "single-process"
    return None


def ms(us: float) -> float:
    """µs -> ms rounded to the µs (the unit and resolution of every answer)."""
    return round(float(us) / 1000.0, 3)


def phase_names(spans: list[SpanAnalysis]) -> list[str]:
    """Canonical phases, then user-named phases in order of first appearance; a phase with no host
    or GPU time in any step of ``spans`` is left out (inference runs have no backward or optimizer)."""
    names = list(PHASES)
    for span in spans:
        names += [p for p in span.phases if p not in names]
    timed = {p for s in spans for j, p in enumerate(s.phases) if s.host_us[:, j].any() or s.gpu_us[:, j].any()}
    return [p for p in names if p in timed] or names


def rank_of(worker: str, spans: list[SpanAnalysis]) -> int | None:
    """The rank the trace records (distributedInfo), else one named in the worker name."""
    for s in spans:
        if s.rank is not None:
            return s.rank
    m = _RANK_IN_NAME.search(worker)
    return int(m.group(1)) if m else None


def rank_order(rank: int | None, worker: str) -> tuple:
    """Sort key of workers: by rank, workers without one last, then by name."""
    return (rank is None, rank if rank is not None else 0, worker)
