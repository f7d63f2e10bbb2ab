"""How long ``phaseprof report --json`` takes on a trace of many steps with almost nothing in them.

    python benchmarks/empty_steps.py [--steps 12500 50000] [--repeat 3]

Builds a trace of N back-to-back ``ProfilerStep#`` ranges on the loop's thread, each holding one
10 µs op and nothing else (a hostile shape: every per-step cost shows, no work hides it), and times
``phaseprof report --json`` on it in a subprocess with the analysis cache off (median of
``--repeat``), with its CPU seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# the checkout, for tests/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.logdir import write_trace  # noqa: E402
from tests.tracebuilder import op, step, thread_names  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[12500, 50000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'steps':>8} {'seconds':>8} {'CPU s':>7}")
    for n in args.steps:
        with tempfile.TemporaryDirectory() as d:
            events = [e for s in range(n)
                      for e in (step(s, s * 100.0, 90.0), op("aten::add", s * 100.0 + 5, 10))]
            path = write_trace(os.path.join(d, "w.1.pt.trace.json"), thread_names() + events)
            cmd = [sys.executable, "-m", "phaseprof.cli", "report", "--json", str(path)]
            walls, cpus = [], []
            for _ in range(args.repeat):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                env = {**os.environ, "PHASEPROF_CACHE": "off"}
                subprocess.run(cmd, check=True, capture_output=True, env=env)
                walls.append(time.perf_counter() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            print(f"{n:>8} {wall:>8.2f} {cpu:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
