"""How fast a real TensorBoard opens the trace of steps never asked before (cold), on the ~160 MB
trace of `big_trace.py`, and TensorBoard's memory meanwhile.

    python benchmarks/step_trace_speed.py [--steps 8] [--gz]

It starts ``tensorboard --logdir`` on a folder holding only the big trace (nothing analysed yet: the
first analysis writes the analysis and the step index beside it), waits until the trace is loaded,
then asks ``/trace`` for ``--steps`` distinct steps spread over the run (the first, the last and
evenly between), each for the first time, and once more for the last of them (kept in memory).
It prints each time, TensorBoard's RSS once loaded and after the steps, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import big_trace  # noqa: E402
from _measure import TensorBoardServer, timed_get  # noqa: E402

BASE = "/data/plugin/phaseprof"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gz", action="store_true", help="the gzipped copy of the trace")
    args = parser.parse_args()
    plain, packed = big_trace.make()
    trace = packed if args.gz else plain
    print(f"trace: {os.path.getsize(trace) / 1e6:.1f} MB; load average at start {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=big_trace.CACHE) as tmp:
        logdir = os.path.join(tmp, "logdir")
        os.makedirs(os.path.join(logdir, "big"))  # a hard link: a symbolic one out of the logdir is not followed
        os.link(trace, os.path.join(logdir, "big", os.path.basename(trace)))
        os.environ["PHASEPROF_CACHE"] = os.path.join(tmp, "user-cache")  # nothing from an earlier run
        tb = TensorBoardServer(sys.executable, logdir)
        try:
            loaded = tb.poll(f"{BASE}/runs", lambda body: (lambda d: d["loading"]["files"] and
                                                           d["loading"]["done"] == d["loading"]["files"])(
                json.loads(body)))
            time.sleep(1.0)  # the loading worker exits once idle
            rss_loaded = tb.rss_mib()
            print(f"loaded {loaded:.1f} s after TensorBoard started; TensorBoard RSS {rss_loaded:.0f} MiB")
            beside = os.path.join(logdir, "big", ".phaseprof")
            sizes = ", ".join(f"{n.rsplit('.', 1)[-1]} {os.path.getsize(os.path.join(beside, n)) / 1e6:.1f} MB"
                              for n in sorted(os.listdir(beside)))
            print(f"beside the trace: {sizes}")
            steps = [s["step"] for s in json.loads(tb.get(f"{BASE}/steps?run=big")[1])["steps"]]
            k = min(args.steps, len(steps))
            chosen = [steps[round(i * (len(steps) - 1) / max(k - 1, 1))] for i in range(k)]
            times = []
            for number in chosen:
                t, body = timed_get(tb, f"{BASE}/trace?run=big&step={number}")
                times.append(t)
                events = len(json.loads(body)["traceEvents"])
                print(f"/trace of step {number:4d}, first ask  {t:.3f} s  ({events:,} events, "
                      f"{len(body) / 1e6:.2f} MB)")
            t, _ = timed_get(tb, f"{BASE}/trace?run=big&step={chosen[-1]}")
            print(f"/trace of step {chosen[-1]:4d}, asked again {t:.3f} s")
            print(f"first asks: median {statistics.median(times):.3f} s, max {max(times):.3f} s over {k} steps")
            print(f"TensorBoard RSS after the steps {tb.rss_mib():.0f} MiB (once loaded {rss_loaded:.0f} MiB)")
        finally:
            tb.close()
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
