"""Names are text in the terminal: never markup, links or control sequences, never longer than a
line can hold; notes that repeat are printed once with a count (docs/security.md)."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys

import msgspec
import pytest
from rich.console import Console

from phaseprof.cli.compare import compare_paths
from phaseprof.cli.compare_table import render as render_compare
from phaseprof.cli.report import report
from phaseprof.cli.terminal import NAME_WIDTH, plain, render
from tests.hostile import encode, training_trace, write
from tests.logdir import settled
from tests.tracebuilder import annotation, op, step

MARKUP = "[/bold]x"
LINK = "[link=http://evil.example]click[/link]"
ESCAPES = "\x1b[31mred\x1b]8;;http://evil.example\x07here\x1b]8;;\x07"
HUGE = "L" * 10_000_000


def hostile_names_trace(path, huge: str = HUGE, steps: int = 3) -> None:
    """Steps whose forward ops and phases carry markup, a link, escape sequences and a name of ten
    million characters."""
    events = training_trace(steps)
    named = itertools.cycle([MARKUP, LINK, ESCAPES])
    for e in events:
        if e["name"] == "aten::mm":
            e["name"] = next(named)
    events += [op(huge, 1012.5, 1.5), annotation("phaseprof::[/oops]", 1090, 5),
               annotation("phaseprof::[link=http://evil.example]p[/link]", 1190, 5)]
    write(path, encode(events))
    settled(path)


def rendered(renderable_report, *, terminal: bool, evidence: bool = False, compare: bool = False) -> str:
    """What the terminal gets: with ``terminal``, as a colour terminal would (rich's own styles and
    links enabled), else plain."""
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=terminal, color_system="truecolor" if terminal else None)
    if compare:
        render_compare(renderable_report, console)
    else:
        render(renderable_report, console, evidence=evidence)
    return out.getvalue()


@pytest.fixture(scope="module")
def hostile_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    hostile_names_trace(root / "run[/b]" / "w\x1b[2J[link=x].1.pt.trace.json")
    return root


@pytest.mark.parametrize("step_number, op_shown", [(None, None), (1, MARKUP), (2, LINK), (3, "\\x1b[31mred\\x1b]8;;")])
def test_names_are_shown_as_text_never_as_markup_links_or_control_sequences(hostile_logdir, step_number, op_shown):
    r = report(str(hostile_logdir), step=step_number, collectives=True)
    assert not r.errors and r.runs[0].collectives is not None
    plain_out = rendered(r, terminal=False, evidence=True)  # MarkupError before: names were read as markup
    assert "\x1b" not in plain_out and "\x07" not in plain_out
    assert "\\x1b[2J[link=x]" in plain_out  # the worker's name, escaped, as written
    assert any(line.startswith("w\\x1b[2J[link=x] │") for line in plain_out.splitlines())  # its collectives' row
    assert "[/oops]" in plain_out and "[link=http://evil.example]p[/link]" in plain_out  # phases
    if op_shown is not None:  # the step's forward op, named with markup or escape sequences
        assert op_shown in plain_out
    coloured = rendered(r, terminal=True, evidence=True)
    assert "\x1b]8;" not in coloured  # no hyperlink (OSC 8), whatever a name holds
    assert "\x1b[31m" not in coloured and "\x1b[2J" not in coloured and "\x07" not in coloured


def test_a_name_of_ten_million_characters_is_cut_in_the_terminal_and_whole_in_json(hostile_logdir):
    r = report(str(hostile_logdir), step=1)
    out = rendered(r, terminal=False)
    assert len(out) < 50_000  # rich folded the whole name over hundreds of thousands of lines before
    assert "L" * (NAME_WIDTH // 2) in out.replace("\n", "").replace("│", "").replace(" ", "")
    (worker,) = r.runs[0].workers
    assert any(o.name == HUGE for ops in worker.detail.ops.values() for o in ops)  # --json keeps it whole


def test_the_comparison_table_shows_names_as_text(tmp_path):
    for side in ("a", "b"):
        hostile_names_trace(tmp_path / side / "w.1.pt.trace.json", huge="M" * 100_000, steps=6)
    result = compare_paths(str(tmp_path / "a"), str(tmp_path / "b"), source="traces")
    assert {MARKUP, LINK, ESCAPES} <= {o.name for o in result.ops} and "[/oops]" in {c.phase for c in result.changes}
    # every change shown, and its ops: make them all count
    result.changes = [msgspec.structs.replace(c, slower=True) for c in result.changes]
    result.ops = [msgspec.structs.replace(o, phase=c.phase) for o, c in zip(result.ops, result.changes)]
    plain_out = rendered(result, terminal=False, compare=True)
    assert "\x1b" not in plain_out and "[/oops]" in plain_out and MARKUP in plain_out
    assert "\\x1b[31mred" in plain_out and LINK in plain_out
    assert "M" * 200 not in plain_out
    coloured = rendered(result, terminal=True, compare=True)
    assert "\x1b]8;" not in coloured and "\x1b[31mred" not in coloured


def test_one_note_per_empty_step_is_printed_once_with_a_count(tmp_path):
    events = training_trace(3) + [step(n, 100_000 + 10 * n, 0) for n in range(4, 2_004)]
    path = write(tmp_path / "w.1.pt.trace.json", encode(events))
    r = report(str(path))
    (worker,) = r.runs[0].workers
    assert sum(f.kind == "empty-step" for f in worker.summary.findings) == 2_000
    out = rendered(r, terminal=False, evidence=True)
    lines = [line for line in out.splitlines() if "is empty" in line]
    assert len(lines) == 1 and "(and 1,999 more like it)" in out.replace("\n", " ")
    assert len(out.splitlines()) < 200


def test_plain_escapes_invisible_characters_and_cuts_to_the_width():
    assert plain("a\x1b[31mb\u202ec\udcff\x00") == "a\\x1b[31mb\\u202ec\\udcff\\x00"
    assert plain("x" * 500, 20) == "x" * 19 + "…"
    assert plain("x" * 20, 20) == "x" * 20
    assert plain("\x00" * 50, 20).endswith("…") and len(plain("\x00" * 50, 20)) == 20
    assert plain("[b]é[/b]") == "[b]é[/b]"


def test_the_command_line_prints_hostile_names_as_text(hostile_logdir):
    out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", "--step", "2", str(hostile_logdir)],
                         capture_output=True, text=True, timeout=600,
                         env={"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PHASEPROF_CACHE": "off",
                              "FORCE_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    assert "\x1b]8;" not in out.stdout and "\x1b[2J" not in out.stdout and "\x1b[31mred" not in out.stdout
    assert "[/oops]" in out.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", "--json", "--step", "1",
                                      str(hostile_logdir)], capture_output=True, timeout=600,
                                     env={"PATH": "/usr/bin:/bin", "PHASEPROF_CACHE": "off"}).stdout)
    names = [o["name"] for ops in data["runs"][0]["workers"][0]["detail"]["ops"].values() for o in ops]
    assert HUGE in names
