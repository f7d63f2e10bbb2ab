"""TensorBoard on logdirs of many ranks: from TensorBoard's start to ``/ranks`` answering for all.

    python benchmarks/ranks_load.py [--ranks 64] [--summaries 1000]

1. ``--ranks`` ranks of real traces: copies of a real rank's trace (tests/data: V100, 68,692 events,
   1.1 MB gzipped), renamed ``rank<N>.host_<pid>.<time>.pt.trace.json.gz`` with the rank in their
   ``distributedInfo`` set to N. Measured three ways: *cold* (no analysis anywhere: TensorBoard's
   worker processes read every trace), *summaries at the source* (each trace's analysis written beside
   it first, as ``PhaseProfiler`` does on each rank's own node), and *reopened* (a second TensorBoard
   on the logdir the cold one left, its analyses cached).
2. ``--summaries`` ranks with their analyses beside them (the traces are links to one file, never read):
   start to ``/ranks`` answering for every rank, and TensorBoard's memory once it has.

Each figure comes with the CPU seconds TensorBoard and its loading processes used by then (the work
done, whatever other processes took of the cores; TensorBoard's own part beside it) and the
machine's load average: a wall time measured on a busy machine says little without them. The
script asks ``/ranks`` every 50 ms from TensorBoard's start (each answer costs TensorBoard a few ms
of CPU). With ``--cold-only`` it also gives what one trace costs a loading process: ``analyze_file``
(read, analyse, write the analysis and step index) in process time, best of ``--per-file`` runs, the
figure that least depends on the machine's load.

Targets: 64 ranks < 5 s on 2 cores (with summaries); 1,000 ranks < 10 s and TensorBoard < 1 GiB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _measure import TensorBoardServer, TreeCpu, median, tree_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "tests", "data", "gpu", "hta_ns_resolution",
                        "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
RUN = "job"
#: Old enough that TensorBoard does not wait for the files to settle.
_SETTLED = time.time() - 3600


def rank_traces(logdir: str, ranks: int) -> list[str]:
    """``ranks`` renamed copies of the template trace, each telling its own rank."""
    with gzip.open(TEMPLATE, "rb") as fh:
        doc = json.load(fh)
    out = []
    os.makedirs(os.path.join(logdir, RUN), exist_ok=True)
    for r in range(ranks):
        doc["distributedInfo"].update(rank=r, world_size=ranks)
        path = os.path.join(logdir, RUN, f"rank{r}.node{r // 8}_{1000 + r}.1712170295000000000.pt.trace.json.gz")
        with gzip.open(path, "wb", compresslevel=1) as fh:
            fh.write(json.dumps(doc).encode())
        os.utime(path, (_SETTLED, _SETTLED))
        out.append(path)
    return out


def write_summaries(logdir: str, linked: bool) -> int:
    """Each trace's analysis beside it, as the training side writes them; ``linked``: the traces are
    one file, analysed once."""
    from phaseprof.plugin import cache
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.spans import analyze_file

    os.environ["PHASEPROF_CACHE"] = "off"  # analyse without storing; entries are stored below
    (run,) = discover(logdir)
    template = None
    for f in run.files:
        if linked and template is not None:
            analysis = template
            analysis.rank = int(f.worker.split(".")[0][4:])
        else:
            analysis = template = analyze_file(f)
        del os.environ["PHASEPROF_CACHE"]
        assert cache.store(f, analysis)
        os.environ["PHASEPROF_CACHE"] = "off"
    del os.environ["PHASEPROF_CACHE"]
    return len(run.files)


def time_to_ranks(logdir: str, ranks: int) -> tuple[float, float, float, float, float, float]:
    """(seconds from launch to /ranks answering for every rank, TensorBoard RSS MiB, with children MiB,
    CPU seconds of TensorBoard and its loading processes by then, the 1-minute load average then,
    TensorBoard's own CPU seconds)."""
    server = TensorBoardServer(sys.executable, logdir)
    cpu_time = TreeCpu(server.proc.pid)
    try:
        answered = server.poll(f"/data/plugin/phaseprof/ranks?run={RUN}",
                               lambda b: len([r for r in json.loads(b)["ranks"] if r["steps"]]) == ranks, timeout=600)
        cpu, own = cpu_time.seconds(), cpu_time.own_seconds()
        rss = server.rss_mib()
        tree = tree_kib(server.proc.pid, "Rss:") / 1024
        return answered, rss, tree, cpu, os.getloadavg()[0], own
    finally:
        cpu_time.close()
        server.close()


def per_file_ms(repeat: int) -> float:
    """Process time (ms) of one rank trace through `analyze_file` with the cache on, as a loading
    process does it (no entry there before), best of ``repeat``."""
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.spans import analyze_file

    logdir = tempfile.mkdtemp(prefix="tb-one-rank-")
    try:
        rank_traces(logdir, 1)
        (run,) = discover(logdir)
        best = float("inf")
        for _ in range(repeat):
            shutil.rmtree(os.path.join(logdir, RUN, ".phaseprof"), ignore_errors=True)
            started = time.process_time()
            analyze_file(run.files[0])
            best = min(best, time.process_time() - started)
        return best * 1000
    finally:
        shutil.rmtree(logdir)


def arguments(doc: str) -> argparse.Namespace:
    """The options of this benchmark and of its object-store twin (``s3_ranks_load.py``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--summaries", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold-only", action="store_true",
                        help="ranks_load.py: only the cold start (and the reopening after it), and one trace's cost")
    parser.add_argument("--per-file", type=int, default=9,
                        help="ranks_load.py --cold-only: runs of one trace through analyze_file (best taken)")
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__)
    print(f"{os.cpu_count()} CPUs; template {os.path.relpath(TEMPLATE, ROOT)}; median of {args.repeat}")
    os.environ.pop("PHASEPROF_CACHE", None)

    rows = {"cold": [], "summaries at the source": [], "reopened": []}
    for _ in range(args.repeat):
        logdir = tempfile.mkdtemp(prefix="tb-ranks-")
        try:
            rank_traces(logdir, args.ranks)
            rows["cold"].append(time_to_ranks(logdir, args.ranks))
            rows["reopened"].append(time_to_ranks(logdir, args.ranks))
            if args.cold_only:
                continue
            shutil.rmtree(os.path.join(logdir, RUN, ".phaseprof"))
            write_summaries(logdir, linked=False)
            rows["summaries at the source"].append(time_to_ranks(logdir, args.ranks))
        finally:
            shutil.rmtree(logdir)
    for label, runs in rows.items():
        if runs:
            print(f"{args.ranks} ranks, {label:24} start->/ranks {median([r[0] for r in runs]):6.2f} s   "
                  f"CPU {median([r[3] for r in runs]):6.2f} s (TensorBoard's own {median([r[5] for r in runs]):.2f})   "
                  f"TensorBoard RSS {median([r[1] for r in runs]):5.0f} MiB"
                  f"   load average {', '.join(f'{r[4]:.1f}' for r in runs)}")

    if args.cold_only and args.per_file:
        load = os.getloadavg()[0]
        print(f"one rank trace through analyze_file (a loading process's work): {per_file_ms(args.per_file):.1f} ms "
              f"process time, best of {args.per_file}   load average {load:.1f}")

    if args.summaries and not args.cold_only:
        logdir = tempfile.mkdtemp(prefix="tb-summaries-")
        try:
            os.makedirs(os.path.join(logdir, RUN))
            one = rank_traces(tempfile.mkdtemp(prefix="tb-one-"), 1)[0]
            for r in range(args.summaries):
                name = f"rank{r}.node{r // 8}_{1000 + r}.1712170295000000000.pt.trace.json.gz"
                os.link(one, os.path.join(logdir, RUN, name))
            write_summaries(logdir, linked=True)
            runs = [time_to_ranks(logdir, args.summaries) for _ in range(args.repeat)]
            print(f"{args.summaries} ranks of summaries         start->/ranks {median([r[0] for r in runs]):6.2f} s   "
                  f"TensorBoard RSS {median([r[1] for r in runs]):5.0f} MiB (with its data server "
                  f"{median([r[2] for r in runs]):.0f} MiB)")
        finally:
            shutil.rmtree(logdir)
            shutil.rmtree(os.path.dirname(os.path.dirname(one)))


if __name__ == "__main__":
    main()
