"""How long the warm-up rule takes to judge a worker's steps, as their number grows.

    python benchmarks/warmup_scaling.py [--steps 1000 4000 16000 64000]

Times ``warmup()`` (plugin/analysis/warmup.py) on N steps of lognormal wall times, the first 30x
the others (median of 5), and prints the ratio per 4x steps: about 4.5 for n log n (one sort), 16
for the median of the others taken afresh per step as it once was (23 s of a 50,000-step trace).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from phaseprof.plugin.analysis.warmup import warmup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 4000, 16000, 64000])
    args = parser.parse_args()
    print(f"{'steps':>8} {'ms':>9} {'x per 4x':>9}")
    last = None
    for n in args.steps:
        wall = np.random.default_rng(n).lognormal(3.0, 0.3, n)
        wall[0] *= 30
        setup, first, rows = np.zeros(n), np.arange(n) == 0, np.arange(n)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            warmup(wall, setup, first, rows)
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times)
        ratio = f"{ms / last:.1f}" if last else ""
        print(f"{n:>8} {ms:>9.2f} {ratio:>9}", flush=True)
        last = ms


if __name__ == "__main__":
    main()
