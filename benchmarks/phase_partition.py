"""How long the phase partition takes with many phase ranges in one step.

    python benchmarks/phase_partition.py [--ranges 4000 20000 100000]

Builds a one-step trace holding N phase ranges (forward, backward and optimizer ranges, nested and
side by side, as a loop with many micro-batches or a deeply annotated model writes them) and times
``phaseprof report --json``'s analysis of it in this process (median of 3). The partition is one
sweep with a heap of open ranges, O(n log n): 20,000 ranges should take well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.reading.decode import read_trace


def ranges_trace(n: int) -> list[dict]:
    def annotation(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [annotation("ProfilerStep#1", 0, 10 * n + 10)]
    names = ("## forward ##", "## backward ##", "Optimizer.step#SGD.step")
    for i in range(n):
        events.append(annotation(names[i % 3], 10 * (i // 2) + 1 + (i % 2), 8 - 3 * (i % 2)))
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranges", type=int, nargs="+", default=[4000, 20000, 100000])
    args = parser.parse_args()
    print(f"{'ranges':>8} {'seconds':>8}")
    for n in args.ranges:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.1.pt.trace.json")
            with open(path, "w") as fh:
                json.dump({"traceEvents": ranges_trace(n)}, fh)
            trace = read_trace(path)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                analyze_trace(trace)
                times.append(time.perf_counter() - start)
        print(f"{n:8d} {statistics.median(times):8.3f}")


if __name__ == "__main__":
    main()
