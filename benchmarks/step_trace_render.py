"""How long the Step view takes to draw the trace of a step holding 50,000 events, in headless
Chromium, inside a real TensorBoard.

    python benchmarks/step_trace_render.py [--events 50000] [--repeat 3]

It writes a Kineto-style trace of one training step with that many events — forward ops on the
loop's thread and backward ops on autograd's thread, nested three deep, each leaf launching a kernel
on one of two streams, with correlations, input shapes and the phase ranges — starts
``tensorboard --logdir`` on it, opens the tab's Step view and reads the tab's own User Timing
measure ``phaseprof:trace-draw``: from the ``/trace`` answer in hand (text) to the trace drawn
(parsed, laid out in lanes and nested rows, painted). It also prints how long ``/trace`` took to
answer in the browser (on the first ask read from the step index written when the trace was
analysed, else cut out of its file; kept after) and the whole time
from opening the page.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _measure  # noqa: E402
from _measure import TensorBoardServer, draw_in_tab, in_browser, print_medians  # noqa: E402

RUN = "big_step"
STEP = 7
DRAW_MEASURE = "phaseprof:trace-draw"
PID, MAIN, AUTOGRAD = 4242, 4242, 4300


def step_events(total: int) -> list[dict]:
    """One step of ``total`` events (host and device); every leaf op launches one kernel."""
    rnd = random.Random(0)
    # per leaf: a parent op, the leaf op, its runtime call, its kernel (and one parent per 4 leaves)
    leaves = total // 4
    events: list[dict] = []
    t, corr = 1_000_000.0, 1
    start = t
    gpu_t = t + 50

    def x(name, cat, tid, ts, dur, **args):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": round(ts, 3),
                       "dur": round(dur, 3), "args": args})

    phases = []
    for phase, tid, leaf_name, kernel in (("forward", MAIN, "aten::addmm", "volta_sgemm_128x64_nn"),
                                          ("backward", AUTOGRAD, "aten::mm", "volta_sgemm_64x64_nt")):
        phase_start = t
        for group in range(leaves // 2 // 4):
            group_start = t
            t += 0.5
            for _ in range(4):
                dur = rnd.uniform(4, 12)
                x("aten::linear", "cpu_op", tid, t, dur + 3)
                x(leaf_name, "cpu_op", tid, t + 0.5, dur + 2, **{"Input Dims": [[64, 128], [128, 128], [128]]})
                x("cudaLaunchKernel", "cuda_runtime", tid, t + 1.0, dur, correlation=corr)
                kdur = rnd.uniform(3, 15)
                gpu_t = max(gpu_t, t + 5)
                events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7 + corr % 2,
                               "ts": round(gpu_t, 3), "dur": round(kdur, 3),
                               "args": {"correlation": corr, "device": 0, "stream": 7 + corr % 2}})
                gpu_t += kdur + 0.5
                corr += 1
                t += dur + 4
            x(f"{phase} block {group}", "user_annotation", tid, group_start, t - group_start)
            t += 1
        phases.append((phase, phase_start, t - phase_start, tid))
    for phase, ts, dur, _ in phases:
        x(f"## {phase} ##", "user_annotation", MAIN, ts, dur)
    end = max(t, gpu_t) + 10
    x(f"ProfilerStep#{STEP}", "user_annotation", MAIN, start - 5, end - start + 5)
    events += [{"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "pt_main_thread"}},
               {"ph": "M", "name": "thread_name", "pid": PID, "tid": AUTOGRAD, "args": {"name": "pt_autograd_0"}}]
    return events


def measure(browser, url: str) -> dict:
    return draw_in_tab(browser, url, f"step&p.phaseprof.run={RUN}&p.phaseprof.step={STEP}", "trace",
                       {"width": 1440, "height": 1000}, 300_000, DRAW_MEASURE, trace_note)


def trace_note(frame) -> dict:
    """What the drawn trace's card says of the events it shows."""
    card = frame.locator(".card", has_text="Trace of the step")
    return {"shown": card.locator(".actions .muted").inner_text()}


def main() -> int:
    args = _measure.drawing_args(__doc__, "events")
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / RUN
        run.mkdir()
        events = step_events(args.events)
        step_events_count = sum(1 for e in events if e["ph"] == "X")
        (run / "worker.1.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
        print(f"one step of {step_events_count:,} events")
        tb = TensorBoardServer(sys.executable, tmp)
        try:
            tb.poll("/data/plugin/phaseprof/runs",
                    lambda body: (lambda d: d["loading"]["files"] and d["loading"]["done"] == d["loading"]["files"])(
                        json.loads(body)))
            results = in_browser(tb.url, measure, args.repeat + 1)
        finally:
            tb.close()
    print(f"the tab says: {results[0]['shown'].strip()}")
    first = results[0]["fetch"]
    print(f"{'/trace answered, first ask':34s} {first:.3f} s (from the step index, else cut out of its file)")
    results = results[1:]  # the first warms up
    print_medians(results, [("draw", "trace drawn, from data in hand"), ("fetch", "/trace answered (kept)"),
                            ("whole", "page opened to trace drawn")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
