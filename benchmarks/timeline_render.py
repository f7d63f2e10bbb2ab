"""How long the Step Phases tab takes to draw a run's timeline of 50,000 steps, in headless
Chromium, inside a real TensorBoard.

    python benchmarks/timeline_render.py [--steps 50000] [--repeat 3]

It writes the steps' per-phase scalars (the tags PhaseProfiler writes every step) into a temporary
logdir, starts ``tensorboard --samples_per_plugin scalars=0`` on it (so every step is kept), opens
the tab on the Timeline view and reads the tab's own User Timing measure ``phaseprof:timeline-draw``:
from the ``/timeline`` answer in hand to the chart drawn (ECharts' ``finished`` event). It also
prints how long the route took to answer in the browser, and the whole time from opening the page.
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _measure  # noqa: E402
from _measure import TensorBoardServer, draw_in_tab, in_browser, print_medians  # noqa: E402

RUN = "long_run"
DRAW_MEASURE = "phaseprof:timeline-draw"


def write_steps(run_dir: Path, steps: int) -> None:
    """Per-step phase times as PhaseProfiler writes them, with the odd slow data-loading step."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from phaseprof.contract import PHASES, STEP_TAG, host_tag

    rnd = random.Random(0)
    base = {"data": 3.0, "forward": 14.0, "backward": 27.0, "optimizer": 6.0, "other": 0.4}
    writer = EventFileWriter(str(run_dir))
    for step in range(steps):
        drift = 1.0 + 0.1 * math.sin(step / 2000)
        times = {p: base[p] * drift * rnd.uniform(0.9, 1.1) for p in PHASES}
        if rnd.random() < 0.002:
            times["data"] += rnd.uniform(20, 60)
        values = [summary_pb2.Summary.Value(tag=host_tag(p), simple_value=v) for p, v in times.items()]
        values.append(summary_pb2.Summary.Value(tag=STEP_TAG, simple_value=sum(times.values())))
        writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=values)))
    writer.close()


def measure(browser, url: str) -> dict:
    """One cold page: TensorBoard, the tab, the timeline fetched and drawn."""
    return draw_in_tab(browser, url, f"timeline&p.phaseprof.run={RUN}", "timeline",
                       {"width": 1400, "height": 900}, 120_000, DRAW_MEASURE, steps_recorded)


def steps_recorded(frame) -> dict:
    """The steps the drawn timeline says it holds."""
    steps = frame.locator(".figure", has_text="Steps recorded").locator(".figure-value").inner_text()
    return {"steps": int(steps.replace(",", ""))}


def main() -> int:
    args = _measure.drawing_args(__doc__, "steps")
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        t = time.perf_counter()
        write_steps(logdir / RUN, args.steps)
        print(f"wrote {args.steps:,} steps of scalars in {time.perf_counter() - t:.1f} s")
        tb = TensorBoardServer(sys.executable, str(logdir), ("--samples_per_plugin", "scalars=0"))
        try:
            results = in_browser(tb.url, measure, args.repeat + 1)[1:]  # the first warms up
        finally:
            tb.close()
    assert all(r["steps"] == args.steps for r in results), results
    print_medians(results, [("draw", "chart drawn, from data in hand"), ("fetch", "/timeline answered (browser)"),
                            ("whole", "page opened to chart drawn")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
