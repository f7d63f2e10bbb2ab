"""How fast a real TensorBoard answers ``/ops`` (every op over all profiled steps) and ``/kernels`` on the
~160 MB trace of `big_trace.py`, once the trace is loaded.

    python benchmarks/ops_speed.py [--repeat 5]

It starts ``tensorboard --logdir`` on a folder holding only the big trace, waits until the trace is
loaded, then times each query the first time it is asked (computed from the op tables kept at load
time) and again (kept per worker until a span changes). Also ``/trace`` and ``/memory`` of one step:
the trace is cut out of the file on demand, the memory curve is kept at load time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import big_trace  # noqa: E402
from _measure import TensorBoardServer, timed_get  # noqa: E402

QUERIES = ["group=name", "group=shapes", "phase=forward", "phase=backward&group=shapes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    plain, _ = big_trace.make()
    print(f"trace: {os.path.getsize(plain) / 1e6:.0f} MB")
    with tempfile.TemporaryDirectory(dir=big_trace.CACHE) as tmp:
        os.mkdir(os.path.join(tmp, "big"))  # a hard link: a symbolic one out of the logdir is not followed
        os.link(plain, os.path.join(tmp, "big", os.path.basename(plain)))
        tb = TensorBoardServer(sys.executable, tmp)
        try:
            loaded = tb.poll("/data/plugin/phaseprof/runs",
                             lambda body: (lambda d: d["loading"]["files"] and
                                           d["loading"]["done"] == d["loading"]["files"])(json.loads(body)))
            print(f"loaded {loaded:.1f} s after TensorBoard started")
            base = "/data/plugin/phaseprof"
            first, again = [], []
            for query in QUERIES:
                t, body = timed_get(tb, f"{base}/ops?run=big&{query}")
                first.append(t)
                again += [timed_get(tb, f"{base}/ops?run=big&{query}")[0] for _ in range(args.repeat)]
                answer = json.loads(body)
                print(f"/ops?{query:28s} first {t:.3f} s  ({len(answer['ops'])} ops over {answer['steps']} steps)")
            print(f"/ops first ask: max {max(first):.3f} s; asked again: median {statistics.median(again):.4f} s")
            t, body = timed_get(tb, f"{base}/kernels?run=big")
            print(f"/kernels (all steps)            {t:.3f} s")
            steps = json.loads(tb.get(f"{base}/steps?run=big")[1])["steps"]
            number = steps[len(steps) // 2]["step"]
            t, body = timed_get(tb, f"{base}/memory?run=big&step={number}")
            print(f"/memory of step {number}            {t:.3f} s")
            t, body = timed_get(tb, f"{base}/trace?run=big&step={number}")
            events = len(json.loads(body)["traceEvents"])
            print(f"/trace of step {number}, first      {t:.3f} s  ({events:,} events, {len(body) / 1e6:.1f} MB, "
                  "cut out of the file)")
            t, _ = timed_get(tb, f"{base}/trace?run=big&step={number}")
            print(f"/trace of step {number}, again      {t:.3f} s")
        finally:
            tb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
