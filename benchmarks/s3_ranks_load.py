"""TensorBoard on a logdir in an S3 store: from TensorBoard's start to ``/ranks`` answering for every rank,
and the bytes TensorBoard read from the store meanwhile.

    python benchmarks/s3_ranks_load.py [--ranks 64] [--summaries 1000]

The store is moto's S3 server on 127.0.0.1 (``pip install 'moto[server]'``), reached through a
counting relay (every byte the store sends goes through it), with the endpoint in the environment as a
user would set it. Two logdirs, uploaded once:

1. ``--ranks`` real rank traces (as `ranks_load`: copies of a real V100 rank trace, 1.1 MB gzipped),
   each with its analysis beside it, written at the source as ``PhaseProfiler`` does: TensorBoard
   should read the analyses, not the traces (target: bytes read <= 5% of the traces' size);
2. ``--summaries`` ranks of a small real CPU trace (tests/data/cpu/base) with their analyses,
   started cold (an empty user cache) and then once more on the user cache the last cold start left:
   the second start should only list the traces (the analyses fetched are kept there with the ETag
   and size of their trace; the analysis folder is left out of the listing). The relay tells
   phaseprof's reader (s3fs: aiobotocore) from TensorBoard's own scalar reader (boto3), which lists
   the prefix at each of its reloads.

After each start's first ``/ranks``, it is asked `RANKS_ASKED` times more and the median time is given:
it is made once per change of the run, not per request. First, the same in this process on a local
logdir of ``--summaries`` ranks of analyses (`ranks_in_process`): the route's own work, without
TensorBoard's HTTP server and threads.

Targets: 64 ranks < 5 s to /ranks on 2 cores with <= 5% of the traces' bytes read; 1,000 ranks < 15 s;
a second start on 1,000 ranks of analyses reads < 1% of the first's bytes; ``/ranks`` at 1,000 workers
answers a repeated request in < 50 ms. ``--ranks 0`` leaves the first logdir out.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import NamedTuple

import msgspec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _measure import TensorBoardServer, TreeCpu, median, timed_get  # noqa: E402
from ranks_load import RUN, arguments, rank_traces, write_summaries  # noqa: E402

from tests.s3 import Relay, S3Server  # noqa: E402

#: ``/ranks`` asked again after its first answer, for the median time of an answer.
RANKS_ASKED = 20

SMALL = os.path.join(ROOT, "tests", "data", "cpu", "base", "mnist.1796067929705444610.pt.trace.json.gz")


class Start(NamedTuple):
    """One TensorBoard start: seconds to /ranks, bytes read from the store (and of them, by phaseprof's
    reader) and requests made to it, CPU seconds of TensorBoard's process tree and of the store's
    process by then, the 1-minute load average; then the median ms of `/ranks` asked again."""

    seconds: float
    read: int
    requests: int
    cpu: float
    store_cpu: float
    load: float
    phaseprof_read: int
    ranks_ms: float


def loaded(loading: dict, files: int) -> bool:
    return loading["files"] >= files and loading["done"] == loading["files"]


def progress(server: TensorBoardServer) -> dict:
    """The loading progress in /runs (none yet while TensorBoard is not answering)."""
    status, body = server.get("/data/plugin/phaseprof/runs")
    return json.loads(body)["loading"] if status == 200 else {"files": 0, "done": 0}


def start_to_ranks(url: str, ranks: int, relay: Relay, store: S3Server) -> Start:
    relay.take()
    store_cpu = TreeCpu(store.pid)
    store_before = store_cpu.seconds()  # the server's CPU time so far (the uploads, earlier starts)
    server = TensorBoardServer(sys.executable, url)
    cpu = TreeCpu(server.proc.pid)
    try:
        # /runs every quarter second while the analyses load, then /ranks, as the tab does (it asks for
        # /runs every 1.5 s, and for the view when they change): each /ranks, or /runs asked twenty
        # times a second, would be computed over every rank loaded so far, taking TensorBoard's time
        deadline = time.monotonic() + 600
        while not loaded(progress(server), ranks):
            if time.monotonic() > deadline:
                raise SystemExit("the analyses did not load in 600 s")
            time.sleep(0.25)
        route = f"/data/plugin/phaseprof/ranks?run={RUN}"
        seconds = server.poll(route, lambda b: len([r for r in json.loads(b)["ranks"] if r["steps"]]) == ranks,
                              timeout=600)
        phaseprof_read = relay.by_client.get("aiobotocore", 0)
        read, asked = relay.take()
        figures = Start(seconds, read, len(asked), cpu.seconds(), store_cpu.seconds() - store_before,
                        os.getloadavg()[0], phaseprof_read, 0.0)
        again = [1000 * timed_get(server, route)[0] for _ in range(RANKS_ASKED)]
        return figures._replace(ranks_ms=median(again))
    finally:
        cpu.close()
        store_cpu.close()
        server.close()


def cold_starts(url: str, ranks: int, repeat: int, relay: Relay, store: S3Server, user_cache: str) -> list[Start]:
    """``repeat`` starts of TensorBoard on ``url``, each with an empty user cache (nothing analysed
    earlier is at hand)."""
    runs = []
    for _ in range(repeat):
        shutil.rmtree(user_cache, ignore_errors=True)
        os.environ["PHASEPROF_CACHE"] = user_cache
        runs.append(start_to_ranks(url, ranks, relay, store))
    return runs


def figures(runs: list[Start]) -> str:
    """The medians of ``runs``, and each run's load average."""
    return (f"start->/ranks {median([r.seconds for r in runs]):6.2f} s   "
            f"{median([r.requests for r in runs])} requests   CPU {median([r.cpu for r in runs]):5.2f} s "
            f"(the store's {median([r.store_cpu for r in runs]):.2f} s)   "
            f"/ranks again {median([r.ranks_ms for r in runs]):.1f} ms   "
            f"load average {', '.join(f'{r.load:.1f}' for r in runs)}")


def summaries_logdir(ranks: int) -> str:
    """A local logdir of ``ranks`` links to one small trace, each with its analysis beside it."""
    local = tempfile.mkdtemp(prefix="s3-bench-")
    os.makedirs(os.path.join(local, RUN))
    for r in range(ranks):
        name = f"rank{r}.node{r // 8}_{1000 + r}.1712170295000000000.pt.trace.json.gz"
        os.link(SMALL, os.path.join(local, RUN, name))
    saved = os.environ.pop("PHASEPROF_CACHE", None)
    write_summaries(local, linked=True)
    if saved is not None:
        os.environ["PHASEPROF_CACHE"] = saved
    return local


def ranks_in_process(workers: int) -> None:
    """``/ranks`` asked again, in this process: the plugin alone (no HTTP server, no store) on a local
    logdir of ``workers`` ranks of analyses: the route's own work per repeated request, and what making
    the ranks once costs."""
    from tensorboard.plugins import base_plugin

    from phaseprof.plugin.analysis.ranks import ranks
    from phaseprof.plugin.serving.plugin import PhaseprofPlugin

    local = summaries_logdir(workers)
    plugin = PhaseprofPlugin(base_plugin.TBContext(logdir=local))
    try:
        assert plugin._store.wait(600)
        run = plugin._store.run(RUN)

        def ms(call, n: int) -> float:
            times = []
            for _ in range(n):
                started = time.perf_counter()
                call()
                times.append(1000 * (time.perf_counter() - started))
            return median(times)

        once = ms(lambda: ranks(RUN, [plugin._store.worker(run, w) for w in run.workers]), 3)
        plugin._analysis().ranks(RUN)
        again = ms(lambda: msgspec.json.encode(plugin._analysis().ranks(RUN)), RANKS_ASKED)
        print(f"/ranks of {workers} workers in process: made once {once:.0f} ms; asked again {again:.1f} ms "
              f"(answer and encoding)   load {os.getloadavg()[0]:.1f}")
    finally:
        plugin._store.close()
        shutil.rmtree(local)


def main() -> None:
    args = arguments(__doc__)
    user_cache = tempfile.mkdtemp(prefix="s3-bench-cache-")
    os.environ["PHASEPROF_CACHE"] = user_cache  # nothing from an earlier run's user cache
    if args.summaries:
        ranks_in_process(args.summaries)
    store = S3Server()
    store.start()
    relay = Relay(store.port)
    env = store.environment()
    env.update(AWS_ENDPOINT_URL=relay.endpoint, S3_ENDPOINT=relay.endpoint)
    os.environ.update(env)
    try:
        print(f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; median of {args.repeat}")
        store.client().create_bucket(Bucket="bench")
        if args.ranks:
            traces_in_store(args, relay, store, user_cache)
        if args.summaries:
            summaries_in_store(args, relay, store, user_cache)
    finally:
        store.stop()
        shutil.rmtree(user_cache, ignore_errors=True)


def traces_in_store(args, relay: Relay, store: S3Server, user_cache: str) -> None:
    """``--ranks`` real rank traces with their analyses: cold starts."""
    local = tempfile.mkdtemp(prefix="s3-bench-")
    rank_traces(local, args.ranks)
    os.environ.pop("PHASEPROF_CACHE", None)
    write_summaries(local, linked=False)
    traces = sum(os.path.getsize(os.path.join(local, RUN, n)) for n in os.listdir(os.path.join(local, RUN))
                 if n.endswith(".gz"))
    store.upload_tree(local, "bench", "ranks")
    shutil.rmtree(local)
    runs = cold_starts("s3://bench/ranks", args.ranks, args.repeat, relay, store, user_cache)
    read = median([r.read for r in runs])
    print(f"{args.ranks} ranks with analyses, S3      {figures(runs)}   "
          f"read {read / 1e6:.2f} MB of {traces / 1e6:.1f} MB of traces ({100 * read / traces:.1f}%)")


def summaries_in_store(args, relay: Relay, store: S3Server, user_cache: str) -> None:
    """``--summaries`` ranks of analyses: cold starts, then a start on the user cache the last left."""
    local = summaries_logdir(args.summaries)
    store.upload_tree(local, "bench", "summaries")
    shutil.rmtree(local)
    runs = cold_starts("s3://bench/summaries", args.summaries, args.repeat, relay, store, user_cache)
    first = median([r.read for r in runs])
    own = median([r.phaseprof_read for r in runs])
    print(f"{args.summaries} ranks of analyses, S3        {figures(runs)}   "
          f"read {first / 1e6:.1f} MB (phaseprof's reader {own / 1e6:.1f} MB)")
    second = start_to_ranks("s3://bench/summaries", args.summaries, relay, store)  # the user cache kept
    print(f"  started again on the user cache     {figures([second])}   "
          f"read {second.read / 1e6:.2f} MB ({100 * second.read / first:.2f}% of the first's; "
          f"phaseprof's reader {second.phaseprof_read / 1e6:.2f} MB, {100 * second.phaseprof_read / first:.2f}%)")


if __name__ == "__main__":
    main()
