"""phaseprof's GPU figures against Holistic Trace Analysis's (HTA 0.5.0), figure by figure, on every
GPU trace under tests/data/gpu; the table and its reasons are in docs/performance.md.

HTA is never installed into the project: it runs in a venv of its own, through that venv's Python
in a subprocess (benchmarks/_hta_side.py):

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0
    python benchmarks/hta_agreement.py [--hta-python /tmp/hta-venv/bin/python] [--record FILE]

One row per trace, rank and figure: HTA's figure, phaseprof's, their difference, and for a
difference beyond 1% its reasons, each with its share. The reasons are measured, not guessed: the
figure is recomputed from the trace's raw events in plain Python (tests/hta_reference.py) with
HTA's choices, then with phaseprof's one at a time (rounding to whole µs, scope, kinds and which
events count); each choice's part of the difference is what changing it alone moves the figure.
Where phaseprof defines a figure another way than HTA, the reason says so (idle over each step's
GPU window, not over the span); for the launch queue and delay, the first row is HTA's figure by
phaseprof's definition, from HTA's own event tables (weighted by time over the same windows; from
the runtime call's start), and a second row HTA's own (a mean over the queue series' change
points; a delay from the call's end). ``--record FILE``: HTA's figures as JSON, what
tests/test_hta_agreement.py checks the reasons with (tests/data/hta_figures.json).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phaseprof.plugin.reading.discovery import discover  # noqa: E402
from phaseprof.plugin.spans import analyze_file  # noqa: E402
from tests.hta_reference import (  # noqa: E402
    device_work,
    figures,
    idle_split,
    launches_hta_leaves_out,
    load,
)

#: A difference beyond this share of the figure is explained.
EXPLAIN = 0.01
#: Kernels per trace in the table, most phaseprof time first.
TOP_KERNELS = 5
#: HTA's idle categories, in the order of `GpuMeasures.idle_split_us`.
IDLE_KINDS = ("host_wait", "kernel_wait", "other")
#: The launch calls HTA's queue counts, as the reasons name them.
HTA_CALLS_SHOWN = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")
#: The choices, from HTA's to phaseprof's, and what each is called in the reasons.
CHOICES = (
    ("rounding", dict(rounded=False, scope="hta", kinds="hta")),
    ("scope", dict(rounded=False, scope="steps", kinds="hta")),
    ("kinds", dict(rounded=False, scope="steps", kinds="phaseprof")),
)
SCOPE = (
    "scope: HTA keeps work launched before the last step's end, outside the steps too; "
    "phaseprof the work launched in its steps"
)
WHY = {
    "rounding": "rounding: HTA rounds each event to whole µs (start up, end down)",
    "scope": SCOPE,
    "kinds": "definition: phaseprof counts kernels, copies and sets (HTA also CUDA's sync events) "
    "and work launched under a collective op as communication",
    "idle_split": "scope: HTA sums every gap on the stream over the trace; phaseprof the gaps "
    "inside each step's GPU window (those between steps' windows are no step's)",
    "idle": "definition: phaseprof's idle is within each step's GPU window (the gaps between "
    "steps' windows are no step's); HTA's over the span from first to last work",
    "queue": "definition: HTA's mean is over the series' change points (whole trace), not weighted "
    "by time over the steps",
    "delay": "definition: HTA's delay runs from the runtime call's end (clipped at 0); phaseprof's "
    "from its start",
}


def hta_figures(requests: dict[str, list], python: str) -> tuple[dict, str]:
    """HTA's figures for each trace (``requests``: path to phaseprof's step windows) and its
    version, from HTA's venv."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(requests, f)
        f.flush()
        done = subprocess.run(
            [python, str(ROOT / "benchmarks" / "_hta_side.py"), f.name],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        sys.exit(f"HTA failed ({python}):\n{done.stderr[-4000:]}")
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return json.loads(done.stdout), version


def _mean(values) -> float | None:
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(kept) / len(kept) if kept else None


def phaseprof_figures(span) -> dict:
    """phaseprof's figures of one trace, over its steps (µs, %)."""
    g = span.gpu
    busy, window = float(g.busy_us.sum()), float(g.window_us.sum())
    comm, exposed = float(g.comm_us.sum()), float(g.exposed_us.sum())
    kernels: dict[str, float] = defaultdict(float)
    t = span.kernels
    for name, us in zip(t.name.tolist(), t.us.tolist()):
        kernels[span.names[name]] += us
    q = span.queues
    per_stream = {}
    for s, label in enumerate(q.streams):
        per_stream[label] = {
            "mean": q.mean[:, s].tolist(),
            "max": q.max[:, s].tolist(),
            "p50": q.delay_p50_us[:, s].tolist(),
            "p90": q.delay_p90_us[:, s].tolist(),
        }
    return {
        "busy": busy,
        "compute": float(g.compute_us.sum()),
        "comm": comm,
        "memory": float(g.memory_us.sum()),
        "idle_pct": 100 * (window - busy) / window if window else None,
        "overlap_pct": 100 * (1 - exposed / comm) if comm else None,
        "kernels": dict(kernels),
        "streams": per_stream,
        "stream_busy": dict(zip(g.streams, g.stream_busy_us.sum(axis=0).tolist())),
        "idle_split": {
            label: dict(zip(IDLE_KINDS, g.idle_split_us[:, s].sum(axis=0).tolist()))
            for s, label in enumerate(g.streams)
        },
    }


def reasons(
    events: list[dict], windows: list, gpu_windows: list, hta_model: dict
) -> dict[str, dict]:
    """Each choice's move of every figure, changing the choices one at a time from HTA's; and of
    each stream's idle split (``idle_split``: HTA's model, then the move of rounding, then that of
    phaseprof's scope: its steps' work, the gaps inside each step's GPU window ``gpu_windows``)."""
    works = {name: device_work(events, windows=windows, **choice) for name, choice in CHOICES}
    moves: dict[str, dict] = {}
    before = hta_model
    for name, _ in CHOICES:
        now = figures(works[name])
        moves[name] = {k: _delta(before.get(k), now.get(k)) for k in now if k != "kernels"}
        moves[name]["kernels"] = {
            k: _delta(before["kernels"].get(k, 0.0), v) for k, v in now["kernels"].items()
        }
        before = now
    rounded = idle_split(device_work(events, rounded=True, scope="hta", kinds="hta"))
    exact = idle_split(works["rounding"])
    ours = idle_split(works["kinds"], windows=gpu_windows)
    moves["idle_split"] = {
        stream: {
            k: (
                exact.get(stream, {}).get(k, 0.0) - v,
                ours.get(stream, {}).get(k, 0.0) - exact.get(stream, {}).get(k, 0.0),
            )
            for k, v in split.items()
        }
        for stream, split in rounded.items()
    }
    return moves


def _delta(a, b):
    return None if a is None or b is None else b - a


def _why(
    figure: str,
    hta: float | None,
    ours: float | None,
    moves: dict,
    kernel: str | None = None,
    definition: str | None = None,
) -> str:
    """The reasons for a difference beyond `EXPLAIN`: the choices that move the figure by more than
    that, largest first, each with its move; what they leave, the definition's."""
    if hta is None or ours is None or abs(ours - hta) <= EXPLAIN * max(abs(hta), 1e-9):
        return ""
    parts, explained = [], 0.0
    for name, _ in CHOICES:
        move = moves[name]["kernels"].get(kernel) if kernel else moves[name].get(figure)
        if move is None:
            continue
        explained += move
        if abs(move) > EXPLAIN * max(abs(hta), 1e-9):
            parts.append((abs(move), f"{WHY[name]} ({_signed(move, figure)})"))
    left = (ours - hta) - explained
    if definition and abs(left) > EXPLAIN * max(abs(hta), 1e-9):
        parts.append((abs(left), f"{WHY[definition]} ({_signed(left, figure)})"))
    return "; ".join(text for _, text in sorted(parts, reverse=True)) or "(none beyond 1% alone)"


def _signed(value: float, figure: str) -> str:
    return f"{value:+.2f} pt" if figure.endswith("_pct") else f"{value / 1000:+.3f} ms"


def _fmt(value, figure: str) -> str:
    if value is None:
        return "-"
    if figure.endswith("_pct") or figure == "queue":
        return f"{value:.2f}"
    return f"{value / 1000:,.3f}"


def rows_of(
    label: str,
    rank: int,
    hta: dict,
    ours: dict,
    moves: dict,
    left_out_by: dict[str, dict[str, int]],
    streams: int,
) -> list[tuple]:
    """The table's rows of one trace: (trace, rank, figure, HTA, phaseprof, difference, reasons)."""
    out = []

    def row(figure, name, h, p, why):
        diff = None if h is None or p is None else p - h
        rel = f" ({100 * diff / h:+.1f}%)" if diff is not None and h else ""
        out.append(
            (
                label,
                rank,
                name,
                _fmt(h, figure),
                _fmt(p, figure),
                (_fmt(diff, figure) + rel) if diff is not None else "-",
                why,
            )
        )

    for figure, key, name in (
        ("busy", "busy_us", "GPU busy (ms)"),
        ("compute", "compute_us", "compute (ms)"),
        ("comm", "communication_us", "communication (ms)"),
        ("memory", "memory_us", "memory (ms)"),
    ):
        row(figure, name, hta[key], ours[figure], _why(figure, hta[key], ours[figure], moves))
    row(
        "idle_pct",
        "idle %",
        hta["idle_pct"],
        ours["idle_pct"],
        _why("idle_pct", hta["idle_pct"], ours["idle_pct"], moves, definition="idle"),
    )
    if hta["overlap_pct"] is not None or ours["overlap_pct"] is not None:
        row(
            "overlap_pct",
            "overlap %",
            hta["overlap_pct"],
            ours["overlap_pct"],
            _why("overlap_pct", hta["overlap_pct"], ours["overlap_pct"], moves),
        )
    top = sorted(ours["kernels"], key=lambda k: -ours["kernels"][k])[:TOP_KERNELS]
    for k in top:
        h, p = hta["kernels_us"].get(k, 0.0), ours["kernels"][k]
        row("kernel", f"kernel {k[:48]} (ms)", h, p, _why("kernel", h, p, moves, kernel=k))
    for stream in sorted(ours["streams"], key=lambda k: -ours["stream_busy"].get(k, 0))[:streams]:
        ql, theirs, delays = (
            ours["streams"][stream],
            hta["queues"].get(stream),
            hta["delays"].get(stream, {}),
        )
        if theirs is None:
            continue
        because = (
            "rounding: HTA's event times are rounded to whole µs"
            if hta["rounded"]
            else "(unexplained)"
        )
        left_out = left_out_by.get(stream)
        queue_why = (
            f"definition: HTA's queue counts launches by {', '.join(sorted(HTA_CALLS_SHOWN))}"
            " only; phaseprof every launch (here also "
            + ", ".join(f"{n} by {c}" for c, n in sorted(left_out.items()))
            + ")"
            if left_out
            else because
        )
        p, h = _mean(ql["mean"]), _mean(theirs["step_mean"])
        row("queue", f"queue mean {stream}", h, p, _pct_why(h, p, queue_why))
        row(
            "queue",
            f"queue mean {stream}, HTA's summary",
            theirs["hta_mean"],
            p,
            _pct_why(theirs["hta_mean"], p, WHY["queue"]),
        )
        p, h = max(ql["max"], default=None), max(theirs["step_max"], default=None)
        row("queue", f"queue max {stream}", h, p, _pct_why(h, p, queue_why))
        for key, name in (("p50", "launch delay median"), ("p90", "launch delay p90")):
            p, h = _mean(ql[key]), _mean(delays.get(key, []))
            row("delay", f"{name} {stream} (ms)", h, p, _pct_why(h, p, because))
        p, h = _mean(ql["p50"]), _mean(delays.get("hta_p50", []))
        row(
            "delay", f"launch delay median {stream}, HTA's (ms)", h, p, _pct_why(h, p, WHY["delay"])
        )
        for key in IDLE_KINDS:
            split = hta["idle_split"].get(stream)  # a kind HTA found no gap of is absent: 0
            h, p = None if split is None else split.get(key, 0.0), ours["idle_split"][stream][key]
            move = moves["idle_split"].get(stream, {}).get(key)
            row(
                "idle",
                f"idle {key.replace('_', ' ')} {stream} (ms)",
                h,
                p,
                _split_why(h, p, move) if h is not None else "",
            )
    return out


def _split_why(h: float, p: float, move: tuple[float, float] | None) -> str:
    """The reasons for an idle split's difference: rounding's move and scope's, each beyond 1%."""
    if move is None or abs(p - h) <= EXPLAIN * max(abs(h), 1e-9):
        return ""
    parts = [
        (abs(m), f"{WHY[name]} ({_signed(m, 'idle')})")
        for name, m in zip(("rounding", "idle_split"), move)
        if abs(m) > EXPLAIN * max(abs(h), 1e-9)
    ]
    return "; ".join(text for _, text in sorted(parts, reverse=True)) or "(none beyond 1% alone)"


def _pct_why(h, p, why: str) -> str:
    if h is None or p is None or abs(p - h) <= EXPLAIN * max(abs(h), 1e-9):
        return ""
    return why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--traces", default=str(ROOT / "tests" / "data" / "gpu"))
    ap.add_argument("--record", help="write HTA's figures here as JSON")
    ap.add_argument(
        "--streams",
        type=int,
        default=2,
        help="queue and delay rows for this many streams of each trace, the busiest first",
    )
    args = ap.parse_args()
    spans, requests = {}, {}
    for folder in sorted(p for p in Path(args.traces).iterdir() if p.is_dir()):
        for run in discover(str(folder)):
            for files in run.workers.values():
                for f in files:
                    span = analyze_file(f, beside=False)
                    path = str(Path(f.path).resolve())
                    spans[path] = (folder.name, span)
                    requests[path] = [[s.start, s.end] for s in span.steps]
    theirs, version = hta_figures(requests, args.hta_python)
    table = []
    for path, (folder, span) in spans.items():
        hta = theirs[path]
        events = load(path)
        hta["rounded"] = any(e["ts"] != e["ts"].to_integral_value() for e in events)
        model = figures(device_work(events, rounded=True, scope="hta", kinds="hta"))
        g = span.gpu
        gpu_windows = [
            (a, a + w) for a, w in zip(g.window_start_us.tolist(), g.window_us.tolist()) if a == a
        ]  # NaN: a step without device work
        moves = reasons(events, requests[path], gpu_windows, model)
        label = f"{folder}/{Path(path).name}"
        table += rows_of(
            label,
            hta["rank"],
            hta,
            phaseprof_figures(span),
            moves,
            launches_hta_leaves_out(events),
            args.streams,
        )
    print(
        f"HTA {version} (HolisticTraceAnalysis, include_last_profiler_step=True) against "
        "phaseprof; times in ms summed over the trace (HTA) or its steps (phaseprof); queue and "
        "delay: mean of the steps' figures, max: the largest"
    )
    head = ("trace", "rank", "figure", "HTA", "phaseprof", "difference", "reason beyond 1%")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in table:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if args.record:
        keep = (
            "rank",
            "steps",
            "busy_us",
            "compute_us",
            "communication_us",
            "memory_us",
            "idle_pct",
            "overlap_pct",
            "kernels_us",
            "queues",
            "delays",
            "idle_split",
        )
        recorded = {
            "hta_version": version,
            "traces": {
                str(Path(p).relative_to(ROOT / "tests" / "data")): {
                    k: v for k, v in h.items() if k in keep
                }
                for p, h in theirs.items()
            },
        }
        Path(args.record).write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
