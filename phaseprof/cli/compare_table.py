"""Render a `phaseprof compare` answer for a terminal: each figure on both sides with its change and
interval, the ops that changed most, and the verdict in one line. Names are text, never markup
(`phaseprof.cli.terminal.plain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from phaseprof.cli.terminal import LINE_WIDTH, plain

if TYPE_CHECKING:
    from phaseprof.plugin.answers import Change, GateReport

#: Ops listed under the table.
OPS_SHOWN = 8


def render(result: GateReport, console: Console) -> None:
    base, new = result.base, result.new
    for name, side in (("base", base), ("new ", new)):
        left_out = f", left out: {plain(', '.join(side.left_out), LINE_WIDTH)}" if side.left_out else ""
        console.print(Text(f"{name} {plain(side.path, LINE_WIDTH)}: {side.steps} steady steps of {side.workers} "
                           f"worker(s){left_out}", style="dim"))
    source = "every steady step (scalars)" if result.source == "scalars" else "the steady traced steps"
    table = Table(show_edge=False, pad_edge=False, header_style="bold",
                  caption=Text(f"median ms per step over {source}; interval: {result.confidence:.0%} confidence, "
                               "joint over all rows"))
    for name, justify in (("phase", "left"), ("clock", "left"), ("base ms", "right"), ("new ms", "right"),
                          ("change", "right"), ("interval", "right"), ("", "left")):
        table.add_column(name, justify=justify)
    for c in result.changes:
        if not (c.base_ms or c.new_ms):
            continue
        mark, style = _verdict(c)
        interval = "-" if c.low is None else f"{_share(c.low)} … {_share(c.high)}"
        change = "-" if c.change is None else f"{c.change:+.1%}"
        # a side that never recorded the figure has no time for it, not a time of 0
        base_ms, new_ms = (f"{ms:,.3f}" if steps else "-"
                           for ms, steps in ((c.base_ms, c.base_steps), (c.new_ms, c.new_steps)))
        cells = (plain(c.phase), c.clock, base_ms, new_ms, change, interval, mark)
        table.add_row(*map(Text, cells), style=style)
    console.print(table)
    one_sided = ", ".join(_named(c) for c in result.changes
                          if not c.comparable and (c.base_ms or c.new_ms))
    if one_sided:
        console.print(Text(f"not comparable, recorded by one side only: {one_sided}", style="dim"))
    slower_phases = {c.phase for c in result.changes if c.slower and c.phase != "step"}
    ops = [o for o in result.ops if not slower_phases or o.phase in slower_phases][:OPS_SHOWN]
    if ops:
        t = Table(title=Text("ops that changed most (self time per step)"), show_edge=False, pad_edge=False,
                  header_style="bold")
        for name, justify in (("phase", "left"), ("op", "left"), ("calls", "right"), ("host ms", "right"),
                              ("GPU ms", "right")):
            t.add_column(name, justify=justify)
        for o in ops:
            t.add_row(*map(Text, (plain(o.phase), plain(o.name), f"{o.a_calls:g} → {o.b_calls:g}",
                                  f"{o.a_self_host_ms:,.3f} → {o.b_self_host_ms:,.3f} ({o.delta_self_host_ms:+,.3f})",
                                  f"{o.delta_self_gpu_ms:+,.3f}")))
        console.print(t)
    for e in result.errors:
        console.print(Text(f"{plain(e.path, LINE_WIDTH)}: {plain(e.error, LINE_WIDTH)}", style="red"))
    threshold = f"{result.threshold:.0%}" if result.threshold * 100 == round(result.threshold * 100) \
        else f"{result.threshold:.1%}"
    if result.slower:
        worst = ", ".join(_said(c) for c in result.changes if c.slower)
        console.print(Text(f"SLOWER by more than {threshold}: {worst}", style="bold red"))
    else:
        console.print(Text(f"no phase slower by more than {threshold} with {result.confidence:.0%} confidence",
                           style="bold green"))


def _verdict(c: Change) -> tuple[str, str | None]:
    """A row's mark and style: slower, faster, not comparable (one side only), or neither."""
    if c.slower:
        return "slower", "bold red"
    if c.faster:
        return "faster", "green"
    return ("", None) if c.comparable else ("not comparable", "dim")


def _named(c: Change) -> str:
    return plain(c.phase) + (" (GPU)" if c.clock == "gpu" else "")


def _said(c: Change) -> str:
    name = _named(c)
    if c.change is None:
        return f"{name} +{c.delta_ms:,.3f} ms"
    interval = f"{_share(c.low)} … {_share(c.high)}"
    return f"{name} {c.change:+.1%} ({c.base_ms:,.3f} → {c.new_ms:,.3f} ms, interval {interval})"


def _share(bound: float) -> str:
    """An interval's bound as a signed percentage; no bound (some base draws were 0) is ∞."""
    return "+∞" if bound == float("inf") else f"{bound:+.1%}"
