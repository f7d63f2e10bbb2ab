"""Render a report (`phaseprof.plugin.answers.Report`) for a terminal with rich: per-step phase
table (with the time kept out of each step apart, after the step's own columns), averages, the
slowest step and why, top ops of the dominant phase, findings, and errors.

Everything a trace or a file system named (runs, workers, phases, ops, kernels, paths, errors) is
text, never markup: it reaches rich only inside `Text` objects, with control characters written as
escapes (`plain`) and long names cut to a width (the whole name is in ``--json``). Notes that repeat
(one per empty step, say) are printed once with a count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from phaseprof.contract import phase_colour

#: A name longer than this is cut, ending in "…" (``--json`` has it whole).
NAME_WIDTH = 120
#: A sentence (a finding, an error) longer than this is cut: only names make one this long.
LINE_WIDTH = 2_000

if TYPE_CHECKING:
    from phaseprof.plugin.answers import (
        CollectivesAnswer,
        GpuTime,
        KernelsAnswer,
        ModulesAnswer,
        PhaseMean,
        PhaseTimes,
        Report,
        StepDetail,
        StepRow,
        Summary,
        WholeRun,
        WorkerReport,
    )

#: With more steps than this, the table shows the first and last ones, outliers and the slowest.
MAX_ROWS = 40
_EDGE = 10


def plain(text: str, width: int | None = NAME_WIDTH) -> str:
    """``text`` as it can be shown on a terminal: control and other invisible characters (escape
    sequences, bidirectional overrides, lone surrogates) written as escapes (``\\x1b``), cut to
    ``width`` characters."""
    cut = width is not None and len(text) > width
    if cut:
        text = text[:width]  # before escaping: a name of millions of characters costs nothing
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                       for c in text)
    if width is not None and (cut or len(text) > width):
        text = text[:width - 1] + "…"
    return text


def shown(text: str) -> str:
    """A path or message on its own line: control characters and bytes that are not UTF-8 escaped."""
    return plain(text, LINE_WIDTH)


def say(text: str, style: str = "") -> Text:
    """A line of ``text`` (names in it already `plain`) for rich: never read as markup."""
    return Text(text, style=style)


def render(report: Report, console: Console, evidence: bool = False) -> None:
    """Print ``report``; ``evidence``: each finding's figures under its sentence; the kernel, module
    and collective tables where the report holds them (``--kernels``, ``--modules``, ``--collectives``)."""
    for run in report.runs:
        for worker in run.workers:
            _worker(run.run, worker, console, evidence)
        if len(run.whole_run) == 1:
            _whole_run(run.run, run.whole_run[0], console)
        elif run.whole_run:
            _ranks_whole_run(run.run, run.whole_run, console)
        if run.collectives is not None:
            _collectives(run.collectives, console)
    if report.errors:
        console.print(say("Errors", "bold red"))
        for e in report.errors:
            console.print(say(f"  {plain(e.path, LINE_WIDTH)}: {plain(e.error, LINE_WIDTH)}", "red"))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _cell(phase: PhaseTimes | PhaseMean, gpu: bool) -> str:
    """Host ms, or host ms/GPU busy ms with one decimal each to keep GPU tables narrow."""
    if not gpu:
        return _fmt(phase.host_ms)
    return f"{phase.host_ms:,.1f}/{phase.gpu_busy_ms:,.1f}"


def _gpu_line(g: GpuTime) -> str:
    """The GPU measures of a (mean) step, each named for what it counts."""
    line = (f"  GPU per step (mean): GPU busy {_fmt(g.busy_ms)} ms (compute {_fmt(g.compute_ms)} ms, exposed "
            f"communication {_fmt(g.exposed_comm_ms)} ms, copies and sets alone "
            f"{_fmt(g.exposed_memory_ms)} ms) · GPU idle in the window {_fmt(g.idle_ms)} ms"
            f" · kernel time (summed over streams) {_fmt(g.kernel_ms)} ms"
            f" · GPU window {_fmt(g.window_ms)} ms")
    if g.memory_ms:
        shown = list(g.memory_kinds.items())[:_EDGE]
        kinds = ", ".join(f"{plain(k)} {_fmt(v)} ms" for k, v in shown)
        line += f" · copies and sets (memory) {_fmt(g.memory_ms)} ms: {kinds}"
    if g.comm_ms:
        line += f" · communication {_fmt(g.comm_ms)} ms, {g.overlap:.0%} of it overlapped by compute"
    if g.past_host_ms:
        line += f" · runs on {_fmt(g.past_host_ms)} ms past the host window"
    if len(g.streams) > 1:
        shown = list(g.streams.items())
        line += " · GPU busy per stream: " + ", ".join(f"{plain(label)} {_fmt(v)} ms" for label, v in shown[:_EDGE])
        line += f", … ({len(shown) - _EDGE:,} more)" if len(shown) > _EDGE else ""
    return line


def _table(**options) -> Table:
    """A table whose title and caption, like its cells, are text, never markup."""
    for key in ("title", "caption"):
        if isinstance(options.get(key), str):
            options[key] = say(options[key])
    return Table(show_edge=False, pad_edge=False, header_style="bold", **options)


def _row(table: Table, *cells: str | Text, style: str | None = None) -> None:
    table.add_row(*(c if isinstance(c, Text) else say(c) for c in cells), style=style)


def _worker(run: str, w: WorkerReport, console: Console, evidence: bool = False) -> None:
    summary = w.summary
    phases = summary.phases
    title = f"run {plain(run)} · worker {plain(w.worker)}"
    if w.rank is not None:
        title += f" · rank {w.rank}" + (f"/{w.world_size}" if w.world_size else "")
    if w.gpu_names:
        title += f" · {plain(w.gpu_names[0])}"
    console.print(say(title, "bold"))
    spans = ", ".join(plain(s) for s in w.spans[:_EDGE])
    if len(w.spans) > _EDGE:
        spans += f", … ({len(w.spans) - _EDGE:,} more)"
    console.print(say(f"  {len(w.spans)} span(s): {spans}", "dim"))
    gpu = w.gpu
    # time kept out of the steps: a column of its own only where some step's window held any
    apart = [(kind, label) for kind, label in (("eval", "eval ms"), ("paused", "paused ms"))
             if any(getattr(r, f"{kind}_ms") for r in w.steps)]
    caption = ("host ms/GPU busy ms (GPU: the work launched in the phase, an instant counted once however many "
               "streams run); GPU idle: host time with the GPU idle" if gpu else "host ms") + "; * inferred"
    if apart:
        caption += "; " + " and ".join(label for _, label in apart) + ": inside the step's window, not in the step"
    if summary.compiling_steps:
        caption += "; c: compiled, left out of the means"
    if summary.warmup_steps:
        caption += "; w: warm-up (one-off setup), left out of the means"
    if summary.cut_steps:
        caption += "; t: cut by the trace's end, left out of the means"
    table = _table(caption=caption)
    table.add_column("step", justify="right")
    table.add_column("wall ms", justify="right")
    for p in phases:
        table.add_column(say(plain(p), f"bold {phase_colour(p)}"), justify="right")
    if gpu:
        table.add_column("GPU busy ms", justify="right")
        table.add_column("GPU window ms", justify="right")
        table.add_column("GPU idle ms", justify="right")
    for _, label in apart:
        table.add_column(label, justify="right", style="dim")
    outliers = set(summary.outliers or [])
    compiled = set(summary.compiling_steps or [])
    warmup = set(summary.warmup_steps or [])
    cut = set(summary.cut_steps or [])
    blank = [""] * (3 * gpu + len(apart))
    for row in _rows_to_show(w.steps, summary):
        if row is None:
            _row(table, "…", *[""] * (len(phases) + 1 + 3 * gpu + len(apart)))
            continue
        cells = [_cell(row.phases[p], gpu) + ("*" if row.phases[p].inferred else "") for p in phases]
        label = (str(row.step) + (" (empty)" if row.empty else "") + (" c" if row.step in compiled else "")
                 + (" w" if row.step in warmup else "") + (" t" if row.step in cut else ""))
        style = "dim" if row.empty else ("yellow" if row.step in outliers else None)
        g = row.gpu_time
        extra = [_fmt(g and g.busy_ms), _fmt(g and g.window_ms), _fmt(row.gpu_idle_ms)] if gpu else []
        extra += [_apart_cell(row, kind, gpu) for kind, _ in apart]
        _row(table, label, _fmt(row.wall_ms), *cells, *extra, style=style)
    if summary.mean is not None and len(w.steps) > 1:
        mean = summary.mean
        table.add_section()
        cells = [_cell(mean[p], gpu) for p in phases]
        _row(table, "mean", _fmt(summary.mean_wall_ms), *cells, *blank, style="bold")
        _row(table, "host share" if gpu else "share", "", *[f"{mean[p].share:.0%}" for p in phases], *blank)
        if gpu:
            _row(table, "GPU share", "", *["-" if mean[p].gpu_share is None else f"{mean[p].gpu_share:.0%}"
                                           for p in phases], *blank)
    console.print(table)
    if summary.gpu_time is not None:
        console.print(say(_gpu_line(summary.gpu_time)))
    if w.detail is not None:
        _detail(w.detail, phases, console)
    elif summary.slowest is not None:
        _overview(summary, console)
    _findings(summary, console, evidence)
    if w.kernels is not None:
        _kernels(w.kernels, console)
    if w.modules is not None:
        _modules(w.modules, console)
    console.print()


#: The module table shows this many rows (``--json`` has them all).
MODULE_ROWS = 40


def _modules(m: ModulesAnswer, console: Console) -> None:
    """The module table (``report --modules``): most forward plus backward host time first."""
    steps = f"step {m.step}" if m.step is not None else f"{m.steps} step(s)"
    if not m.modules:
        console.print(say(f"modules · {steps}: none recorded (PhaseProfiler(modules=True), or with_stack=True)",
                          "dim"))
        return
    t = _table(title=f"modules · {steps}, from {m.source}: forward phase {m.forward_phase_ms:,.2f} ms; a module's "
                     "time holds its children's", title_justify="left")
    columns = ["module", "calls", "forward ms", "self ms", "backward ms"]
    columns += ["fwd GPU ms", "bwd GPU ms"] if m.has_gpu else []
    columns += ["top op"]
    for col in columns:
        t.add_column(col, justify="left" if col in ("module", "top op") else "right")
    for r in m.modules[:MODULE_ROWS]:
        gpu = [_fmt(r.forward_gpu_ms), _fmt(r.backward_gpu_ms)] if m.has_gpu else []
        _row(t, plain(r.path, _KERNEL_NAME_WIDTH), f"{r.calls:,}", _fmt(r.forward_ms), _fmt(r.forward_self_ms),
             _fmt(r.backward_ms), *gpu, plain(r.ops[0].name, _OP_WIDTH) if r.ops else "-")
    console.print(t)
    _more(len(m.modules), MODULE_ROWS, "modules", console)
    _left_out(m.left_out_why, console)


def _left_out(why: str | None, console: Console) -> None:
    """The line under a run-wide table that says which steps it left out (warm-up, compiling)."""
    if why:
        console.print(say(why, "dim"))


#: The kernel table shows this many rows (``--json`` has them all) and names cut to these widths.
KERNEL_ROWS = 30
_KERNEL_NAME_WIDTH = 60
_OP_WIDTH = 32


def _kernels(k: KernelsAnswer, console: Console) -> None:
    """The kernel table (``report --kernels``), in the order the report holds (``--sort``)."""
    steps = f"step {k.step}" if k.step is not None else f"{k.steps} step(s)"
    t = _table(title=f"kernels · {steps}: {k.gpu_us / 1000:,.2f} ms of kernel time; launch figures of the "
                     "longest call, blocks per SM and occupancy weighted by duration", title_justify="left")
    for col in ("kernel", "calls", "total ms", "mean µs", "max µs", "share", "blocks/SM", "occup. %", "grid",
                "block", "regs", "smem B", "TC", "op", "phase"):
        t.add_column(col, justify="left" if col in ("kernel", "grid", "block", "op", "phase") else "right")
    for r in k.kernels[:KERNEL_ROWS]:
        _row(t, plain(r.name, _KERNEL_NAME_WIDTH), f"{r.calls:,}", _fmt(r.total_us / 1000), _fmt(r.mean_us),
             _fmt(r.max_us), f"{r.share:.1%}", _fmt(r.blocks_per_sm), _fmt(r.occupancy), _dims(r.grid),
             _dims(r.block), "-" if r.registers is None else str(r.registers),
             "-" if r.shared_memory is None else f"{r.shared_memory:,}",
             {True: "yes", False: "no", None: "-"}[r.tensor_cores], plain(r.op, _OP_WIDTH), plain(r.phase))
    console.print(t)
    _more(len(k.kernels), KERNEL_ROWS, "kernels", console)
    _left_out(k.left_out_why, console)


#: The collective table and the list of waits show this many rows (``--json`` has them all).
COLLECTIVE_ROWS = 30
WAITED_FOR_ROWS = 5


def _collectives(c: CollectivesAnswer, console: Console) -> None:
    """A run's collectives (``report --collectives``): the table, most time first; each rank's
    compute / communication / overlap / other per step; the ranks the others waited for most."""
    steps = f"step {c.step}" if c.step is not None else "every step"
    head = f"run {plain(c.run)} · collectives · {steps}: {plain(c.note, LINE_WIDTH)}"
    console.print(say(head, "bold"))
    if not c.collectives:
        console.print(say("  no collective in these steps", "dim"))
    else:
        t = _table(caption="time: the device work's, start to end, where it ran on a GPU (it includes the "
                           "wait for the other ranks), else the host op's; bus bandwidth as nccl-tests counts it")
        for col in ("worker", "kind", "group", "ranks", "size", "calls", "total ms", "mean ms", "max ms",
                    "bus GB/s", "on"):
            t.add_column(col, justify="left" if col in ("worker", "kind", "group", "on") else "right")
        for r in sorted(c.collectives, key=lambda r: -r.time_ms)[:COLLECTIVE_ROWS]:
            _row(t, plain(r.worker), plain(r.kind), plain(r.group), "-" if r.group_size is None else str(r.group_size),
                 _size(r.bytes), f"{r.calls:,}", _fmt(r.time_ms), _fmt(r.mean_ms), _fmt(r.max_ms),
                 _fmt(r.busbw_gbps), "GPU" if r.on_gpu else "host")
        console.print(t)
        _more(len(c.collectives), COLLECTIVE_ROWS, "rows", console)
    t = _table(caption="ms per step, mean over the steps; overlap: communication while compute ran")
    columns = ("worker", "rank", "measure", "steps", "compute", "communication", "overlap", "memory",
               "other")
    for col in columns:
        t.add_column(col, justify="left" if col in ("worker", "measure") else "right")
    for r in c.ranks:
        n = len(r.steps)
        mean = [sum(getattr(s.total, f) for s in r.steps) / n if n else None
                for f in ("compute_ms", "comm_ms", "overlap_ms", "memory_ms", "other_ms")]
        _row(t, plain(r.worker), "-" if r.rank is None else str(r.rank), r.measure, str(n), *map(_fmt, mean))
    console.print(t)
    waited = sorted((w for w in c.waited_for if w.last), key=lambda w: -w.caused_ms)[:WAITED_FOR_ROWS]
    for w in waited:
        who = f"rank {w.rank}" if w.rank is not None else f"worker {plain(w.worker)}"
        console.print(say(f"  • {who} arrived last at {w.last:,} of {w.matched:,} collectives matched across ranks; "
                          f"the others waited {_fmt(w.caused_ms)} ms for it"))
    console.print()


def _size(nbytes: int | None) -> str:
    """A message size in binary units (KiB, MiB, GiB), as memory is shown elsewhere in the report."""
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,} B"


def _more(rows: int, shown: int, what: str, console: Console) -> None:
    """The line under a table cut to ``shown`` of its ``rows``."""
    if rows > shown:
        console.print(say(f"  … {rows - shown:,} more {what} (--json lists them all)", "dim"))


def _dims(dims: list[int] | None) -> str:
    return "-" if dims is None else "×".join(map(str, dims))


def _findings(summary: Summary, console: Console, evidence: bool) -> None:
    """Each finding in a line (its figures under it with ``evidence``); a note of a kind that repeats
    (one per empty step, say) once, with how many more there are."""
    notes: dict[str, int] = {}
    for finding in summary.findings:
        if finding.saving_ms is None:
            notes[finding.kind] = notes.get(finding.kind, 0) + 1
    shown: set[str] = set()
    for finding in summary.findings:
        repeated = notes.get(finding.kind, 0) if finding.saving_ms is None else 0
        if repeated > 1 and finding.kind in shown:
            continue
        shown.add(finding.kind)
        saving = f"[≤ {finding.saving_ms:,.2f} ms] " if finding.saving_ms is not None else ""
        more = f" (and {repeated - 1:,} more like it)" if repeated > 1 else ""
        console.print(say("  • " + saving + plain(finding.text, LINE_WIDTH) + more))
        if evidence:
            figures = msgspec.structs.asdict(finding.evidence)
            shown_figures = [f"{k.replace('_', ' ')}: {_figure(v)}" for k, v in figures.items() if v is not None]
            if shown_figures:
                console.print(say("      " + plain(" · ".join(shown_figures), LINE_WIDTH), "dim"))


def _figure(value) -> str:
    """One figure of a finding's evidence: a value, or the first values of a list."""
    if not isinstance(value, list):
        return plain(str(value))
    head = ", ".join(plain(str(v)) for v in value[:_EDGE])
    return head + (f", … ({len(value) - _EDGE:,} more)" if len(value) > _EDGE else "")


def _apart_cell(row: StepRow, kind: str, gpu: bool) -> str:
    """A step's time of one kind kept out of it: host ms (host/GPU ms on GPU runs), blank if none."""
    host, device = getattr(row, f"{kind}_ms"), getattr(row, f"{kind}_gpu_ms")
    if not host and not device:
        return ""
    return f"{host:,.1f}/{device:,.1f}" if gpu else _fmt(host)


def _whole_run(run: str, w: WholeRun, console: Console) -> None:
    """Every timed step of the run (its scalars): spread per phase, slowest steps, profiler time."""
    who = f" · rank {w.rank}" if w.rank is not None else ""
    head = f"run {plain(run)}{who} · whole run: {w.steps:,} steps timed (steps {w.first_step}–{w.last_step})"
    if w.left_out:  # as the summary printed on close
        head = (f"run {plain(run)}{who} · whole run: steps {w.first_step}–{w.last_step}; figures over {w.steps:,} "
                f"steady step(s), left out: " + ", ".join(w.left_out))
    console.print(say(head, "bold"))
    t = _table(caption="ms per step, every step of the run")
    for col in ("phase", "median", "p90", "p99", "max", "mean"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in w.phases:
        _row(t, plain(p.phase) + (" (GPU)" if p.clock == "gpu" else ""),
             *(_fmt(v) for v in (p.median_ms, p.p90_ms, p.p99_ms, p.max_ms, p.mean_ms)),
             style="bold" if p.phase == "step" else None)
    console.print(t)
    if w.slowest:
        console.print(say("  slowest steps: " + ", ".join(
            f"{s.step} ({_fmt(s.wall_ms)} ms; {plain(s.phase)} +{_fmt(s.phase_over_median_ms)})" for s in w.slowest)))
    _apart_lines(w, console)
    console.print()


def _apart_lines(w: WholeRun, console: Console) -> None:
    """The time the run spent outside its steps (evaluation passes, the profiler's own) and the
    hook's own."""
    if w.eval and w.eval.total_ms:
        e = w.eval
        console.print(say(f"  evaluation, outside the steps: {e.steps} pass(es), {_fmt(e.total_ms)} ms in all "
                          f"({e.share:.2%} of the run), median {_fmt(e.median_ms)} ms, at most {_fmt(e.max_ms)} ms "
                          f"(before step {e.max_step})"))
    if w.profiler:
        p = w.profiler
        console.print(say(f"  profiler's own time: {_fmt(p.total_ms)} ms in all ({p.share:.2%} of the run), "
                          f"median {_fmt(p.median_ms)} ms, at most {_fmt(p.max_ms)} ms after step {p.max_step}"))
    if w.hook:
        h = w.hook
        console.print(say(f"  phaseprof's hooks, outside the phases: {_fmt(h.total_ms)} ms in all "
                          f"({h.share:.2%} of the run), median {_fmt(h.median_ms)} ms a step "
                          "(phaseprof/hook_ms: its own bookkeeping, trace ranges and CUDA marks at the "
                          "phase boundaries, in no phase and not in the steps' time)"))


def _ranks_whole_run(run: str, ranks: list[WholeRun], console: Console) -> None:
    """Every timed step of each rank, one row per rank; the highest median of each column in bold."""
    console.print(say(f"run {plain(run)} · whole run of {len(ranks)} ranks (per-step scalars)", "bold"))
    phases: list[str] = []
    for w in ranks:
        phases += [p.phase for p in w.phases if p.clock == "host" and p.phase not in phases]
    medians = [{p.phase: p.median_ms for p in w.phases if p.clock == "host"} for w in ranks]
    worst = {ph: max(m.get(ph, float("-inf")) for m in medians) for ph in phases}
    kinds = (("eval ms in all", "eval"), ("profiler ms in all", "profiler"),
             ("hook ms in all", "hook"))
    apart = [(label, kind) for label, kind in kinds
               if any(getattr(w, kind) and getattr(w, kind).total_ms for w in ranks)]
    t = _table(caption="median ms per step over every steady step (the first and compiling ones left out); the "
                       "highest of each column in bold"
                       + ("; outside the steps: " + " and ".join(label for label, _ in apart) if apart else ""))
    for col in ("rank", "steps", "step p90", "step max", *(plain(ph) for ph in phases),
                *(label for label, _ in apart)):
        t.add_column(say(col), justify="right")
    for w, m in zip(ranks, medians):
        step = next(p for p in w.phases if p.phase == "step" and p.clock == "host")
        cells = [say(_fmt(m.get(ph)), "bold" if m.get(ph) == worst[ph] else "") for ph in phases]
        cells += [say(_fmt(getattr(w, kind).total_ms if getattr(w, kind) else None), "dim") for _, kind in apart]
        _row(t, "-" if w.rank is None else str(w.rank), f"{w.steps:,}", _fmt(step.p90_ms), _fmt(step.max_ms), *cells)
    console.print(t)
    slowest = max((s for w in ranks for s in w.slowest[:1]), key=lambda s: s.wall_ms, default=None)
    if slowest is not None:
        rank = next(w.rank for w in ranks if w.slowest and w.slowest[0] is slowest)
        console.print(say(f"  slowest step of any rank: {slowest.step} on rank {rank} ({_fmt(slowest.wall_ms)} ms; "
                          f"{plain(slowest.phase)} +{_fmt(slowest.phase_over_median_ms)})"))
    console.print()


def _rows_to_show(rows: list[StepRow], summary: Summary) -> list[StepRow | None]:
    if len(rows) <= MAX_ROWS:
        return rows
    keep = set(range(_EDGE)) | set(range(len(rows) - _EDGE, len(rows)))
    flagged = (set(summary.outliers or []) | set(summary.warmup_steps or [])
               | ({summary.slowest.step} if summary.slowest else set()))
    keep |= {i for i, r in enumerate(rows) if r.step in flagged}
    out: list[StepRow | None] = []
    for i, r in enumerate(rows):
        if i in keep:
            out.append(r)
        elif out and out[-1] is not None:
            out.append(None)
    return out


def _overview(summary: Summary, console: Console) -> None:
    slow = summary.slowest
    line = f"  slowest: step {slow.step} ({_fmt(slow.wall_ms)} ms)"
    judged = summary.noise
    if slow.noise == "too-few-steps":
        line += f": too few steps to tell from noise (at least {judged.min_steps if judged else 5})"
    elif slow.noise == "within-noise":
        line += f", within the steps' noise (±{_fmt(slow.noise_ms)} ms of the median {_fmt(summary.median_wall_ms)} ms)"
        if judged and judged.fast:
            line += f"; step{'s' if len(judged.fast) > 1 else ''} {', '.join(map(str, judged.fast))} faster, beyond it"
    elif slow.phase is not None:
        line += (f", {_fmt(slow.vs_median_ms)} ms over the median step {slow.median_step} (beyond the noise of "
                 f"±{_fmt(slow.noise_ms)} ms); {plain(slow.phase)} grew {_fmt(slow.phase_delta_ms)} ms")
        if slow.ops:
            line += ": " + ", ".join(f"{plain(o.name)} {o.delta_self_host_ms:+.2f} ms" for o in slow.ops[:3])
    console.print(say(line))
    if not summary.top_ops:
        return
    gpu = summary.gpu
    t = _table(title=f"top ops of {plain(summary.dominant_phase or '')} (mean per step, by self "
                     f"{'GPU' if summary.measure == 'gpu' else 'host'} time)", title_justify="left")
    t.add_column("op", overflow="fold")
    t.add_column("calls", justify="right")
    t.add_column("self ms", justify="right")
    t.add_column("total ms", justify="right")
    if gpu:
        t.add_column("self GPU ms", justify="right")
        t.add_column("GPU ms", justify="right")
    for o in summary.top_ops:
        extra = [_fmt(o.self_gpu_ms), _fmt(o.gpu_ms)] if gpu else []
        _row(t, plain(o.name), f"{o.calls:g}", _fmt(o.self_host_ms), _fmt(o.host_ms), *extra)
    console.print(t)


def _detail(detail: StepDetail, phases: list[str], console: Console) -> None:
    for p in phases:
        ops = detail.ops.get(p) or []
        mem = detail.memory.get(p) or {}
        if not ops and not mem:
            continue
        times = detail.phases[p]
        gpu = (f", GPU busy {_fmt(times.gpu_busy_ms)} ms, kernel time (summed over streams) {_fmt(times.gpu_ms)} ms"
               if detail.gpu_time is not None else "")
        t = _table(title=f"step {detail.step} · {plain(p)}: {_fmt(times.host_ms)} ms host{gpu}", title_justify="left")
        gpu = any(o.gpu_ms for o in ops)
        columns = [("op", "left"), ("input shapes", "left"), ("calls", "right"), ("self ms", "right"),
                   ("total ms", "right")] + ([("self GPU ms", "right"), ("GPU ms", "right")] if gpu else [])
        for col, just in columns:
            t.add_column(col, justify=just, overflow="fold")
        for o in ops[:10]:
            extra = [_fmt(o.self_gpu_ms), _fmt(o.gpu_ms)] if gpu else []
            _row(t, plain(o.name), plain(o.shapes or ""), str(o.calls), _fmt(o.self_host_ms), _fmt(o.host_ms), *extra)
        console.print(t)
        for device, m in mem.items():
            peak = "-" if m.peak_bytes is None else f"{m.peak_bytes / 2**20:,.1f} MiB"
            console.print(say(f"    memory {plain(device)}: peak {peak}, net {m.delta_bytes / 2**20:+,.1f} MiB"))
