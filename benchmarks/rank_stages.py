"""Where one rank trace's load goes: each stage of `analyze_file`, and each part of the analysis.

    python benchmarks/rank_stages.py [--repeat 11]

The template trace of ``ranks_load.py`` (a V100 rank, 68,692 events). Each stage (read, nesting,
partition, analysis, the cache entry, the step index) is run ``--repeat`` times in this process and
its best process time printed; the analysis's parts are timed by wrapping each function
`analyze_trace` calls from its module's namespace (inclusive times: a part that calls another
counts it too). Process time is what least depends on the machine's load, yet on a busy machine it
is still ~1.5x a quiet one's: compare two versions run one after the other, and give the load.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ranks_load import RUN, rank_traces  # noqa: E402

#: The functions `analyze_trace` calls that are worth a line (those absent in a version are skipped).
PARTS = ("launches", "blocking_mask", "_waits", "communication", "gpu_measures", "_op_gpu",
         "streams", "launch_queues", "blocking_calls", "critical_paths", "_op_table", "kernel_table",
         "collective_table", "memory_tables", "_lanes", "untraced_us", "module_table", "_Busy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()

    from phaseprof.plugin.reading.discovery import discover

    logdir = tempfile.mkdtemp(prefix="rank-stages-")
    try:
        rank_traces(logdir, 1)
        (run,) = discover(logdir)
        measure(run.files[0].path, args.repeat)
    finally:
        shutil.rmtree(logdir)


def measure(path: str, repeat: int) -> None:
    """Print each stage's and each analysis part's best process time over ``repeat`` runs."""
    from phaseprof.plugin import cache, step_index
    from phaseprof.plugin.analysis import span
    from phaseprof.plugin.analysis.nesting import nest
    from phaseprof.plugin.analysis.partition import partition
    from phaseprof.plugin.analysis.step_trace import StepCutter
    from phaseprof.plugin.reading.decode import read_trace

    trace = read_trace(path)
    spent: dict[str, float] = collections.defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **k):
            started = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.process_time() - started
        return wrapper

    for name in PARTS:
        if hasattr(span, name):
            setattr(span, name, timed(name, getattr(span, name)))
    n = nest(trace.host)
    part = partition(trace, n)
    analysis = span.analyze_trace(trace, worker=RUN, n=n, part=part)
    key = cache.Key("key", 1, 1, cache.version())
    stages = {
        "read (read_trace)": lambda: read_trace(path),
        "nesting (nest)": lambda: nest(trace.host),
        "partition": lambda: partition(trace, n),
        "analysis (analyze_trace)": lambda: span.analyze_trace(trace, worker=RUN, n=n, part=part),
        "cache entry (encode)": lambda: cache._encode(cache.Entry(key, analysis)),
        "step index (encode)": lambda: step_index.encode(key, StepCutter(trace, n, part)),
    }
    best: dict[str, float] = collections.defaultdict(lambda: float("inf"))
    for _ in range(repeat):
        for stage, fn in stages.items():
            gc.collect()
            spent.clear()
            started = time.process_time()
            fn()
            best[stage] = min(best[stage], time.process_time() - started)
            if stage.startswith("analysis"):
                for name, seconds in spent.items():
                    best[f"  {name}"] = min(best[f"  {name}"], seconds)
    print(f"{len(trace.host) + len(trace.device)} events; best of {repeat}, process time; "
          f"load average {os.getloadavg()[0]:.1f}")
    for stage in stages:
        print(f"{stage:28} {best[stage] * 1000:7.2f} ms")
        if stage.startswith("analysis"):
            parts = sorted((k for k in best if k.startswith("  ")), key=lambda k: -best[k])
            for k in parts:
                print(f"{k:28} {best[k] * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
