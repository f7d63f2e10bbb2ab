"""How ``phaseprof compare`` scales with the number of runs a side.

    python benchmarks/compare_scaling.py [--runs 500 2000 10000] [--keep DIR]

Builds BASE and NEW folders of N runs each, every run a real event file of 3 steps of phase
scalars as the training hook writes them (the first step is left out: 2 steps a run), the NEW
runs 10% slower, and times ``phaseprof compare BASE NEW --json`` in a subprocess; then runs it again
to take the peak memory (PSS) of its process tree. The ranks of a distributed job count as runs,
so a job of thousands of ranks meets these sizes with one run a side. ``--keep DIR`` keeps the
built folders under DIR and reuses them on the next call.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

# the checkout, for tests/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._measure import peak_mib, timed  # noqa: E402
from phaseprof.contract import STEP_TAG, host_tag  # noqa: E402
from tests.logdir import write_events  # noqa: E402

PHASES = ("data", "forward", "backward", "optimizer")


def build(folder: str, runs: int, slower: float) -> None:
    """``runs`` runs of 3 steps under ``folder``, their phase times ``slower`` times a base."""
    for r in range(runs):
        rows = []
        for s in range(3):
            # phase i takes 2 + i ms, give or take up to 0.1 ms varying with run and step
            jitter = [0.01 * ((r * 7 + s * 3 + i) % 11) for i in range(len(PHASES))]
            times = {host_tag(p): slower * (2.0 + i + jitter[i]) for i, p in enumerate(PHASES)}
            rows.append((s, {**times, STEP_TAG: sum(times.values()) + 0.5}))
        write_events(os.path.join(folder, f"run{r:05d}"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[500, 2000, 10000])
    parser.add_argument("--keep", help="build the runs under this folder and reuse them")
    args = parser.parse_args()
    print(f"{'runs a side':>11} {'seconds':>8} {'peak MiB':>9}  verdict")
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.runs:
            where = os.path.join(args.keep or scratch, f"runs{n}")
            base, new = os.path.join(where, "base"), os.path.join(where, "new")
            if not os.path.isdir(new):
                build(base, n, 1.0)
                build(new, n, 1.10)
            cmd = [sys.executable, "-m", "phaseprof.cli", "compare", base, new, "--json"]
            seconds, result = timed(cmd)
            if result.returncode not in (0, 1):
                why = result.stderr.decode()[-500:]
                raise SystemExit(f"compare failed ({result.returncode}): {why}")
            verdict = "slower" if result.returncode == 1 else "not slower"
            print(f"{n:>11} {seconds:>8.1f} {peak_mib(cmd):>9.0f}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
