"""How ``phaseprof report --json --modules`` grows with a trace, one dimension at a time.

    python benchmarks/scaling.py [--dimensions steps "nesting depth"] [--factors 1 4 16] [--top N]

Builds each dimension's trace (`tests/scaling_traces.py`: steps, empty steps, events per step,
nesting depth, streams, ranks, phase ranges in a step) at 1x, 4x and 16x its base size and runs the
report on it in a subprocess with the analysis cache off. Prints wall and CPU seconds, the peak
RSS of the report's process, and the ratio of CPU seconds per 4x (linear is 4, n log n about 4.5;
the process's start, ~0.3 s, holds the small sizes' ratios down). ``--top N`` caps a size at N
(the largest traces take minutes on a busy machine). The operation counts behind the same
dimensions are checked by tests/test_scaling.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the checkout, for tests/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.scaling_traces import DIMENSIONS  # noqa: E402

#: Runs a command and prints its CPU seconds and peak RSS (of the largest process in its tree).
_WRAP = """
import json, resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu": r.ru_utime + r.ru_stime, "rss_mib": r.ru_maxrss / 1024}))
"""


def measure(path: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of ``phaseprof report --json --modules`` on ``path``."""
    cmd = [sys.executable, "-m", "phaseprof.cli", "report", "--json", "--modules", str(path)]
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _WRAP, *cmd], check=True, capture_output=True,
                         text=True, env={**os.environ, "PHASEPROF_CACHE": "off"})
    wall = time.perf_counter() - start
    figures = json.loads(out.stdout)
    return wall, figures["cpu"], figures["rss_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimensions", nargs="+", default=list(DIMENSIONS),
                        choices=list(DIMENSIONS))
    parser.add_argument("--factors", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--top", type=int, default=None, help="the largest size built")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load before: {f.read().split()[:3]}")
    print("| dimension | size | trace MB | wall s | CPU s | peak RSS MiB | CPU ratio per 4x |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.dimensions:
        build, base, _ = DIMENSIONS[name]
        previous = None
        for factor in args.factors:
            n = base * factor
            if args.top is not None and n > args.top:
                break
            with tempfile.TemporaryDirectory() as d:
                path = build(n, Path(d))
                size = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file()) / 1e6
                wall, cpu, rss = measure(path)
            ratio = f"{cpu / previous:.2f}" if previous else ""
            print(f"| {name} | {n:,} | {size:.1f} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {ratio} |",
                  flush=True)
            previous = cpu
    with open("/proc/loadavg") as f:
        print(f"load after: {f.read().split()[:3]}")


if __name__ == "__main__":
    main()
