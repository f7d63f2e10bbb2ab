"""TensorBoard on a logdir in an S3 store: from TensorBoard's start to ``/ranks`` answering for every rank,
and the bytes TensorBoard read from the store meanwhile.

    python benchmarks/s3_ranks_load.py [--ranks 64] [--summaries 1000]

The store is moto's S3 server on 127.0.0.1 (``pip install 'moto[server]'``), reached through a
counting relay (every byte the store sends goes through it), with the endpoint in the environment as a
user would set it. Two logdirs, uploaded once:

1. ``--ranks`` real rank traces (as `ranks_load`: copies of a real V100 rank trace, 1.1 MB gzipped),
   each with its analysis beside it, written at the source as ``PhaseProfiler`` does: TensorBoard
   should read the analyses, not the traces (target: bytes read <= 5% of the traces' size);
2. ``--summaries`` ranks of a small real CPU trace (tests/data/cpu/base) with their analyses.

Targets: 64 ranks < 5 s to /ranks on 2 cores with <= 5% of the traces' bytes read; 1,000 ranks < 15 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _measure import TensorBoardServer, median  # noqa: E402
from ranks_load import RUN, arguments, rank_traces, write_summaries  # noqa: E402

from tests.s3 import S3Server  # noqa: E402

SMALL = os.path.join(ROOT, "tests", "data", "cpu", "base", "mnist.1796067929705444610.pt.trace.json.gz")


class Relay:
    """A TCP relay on 127.0.0.1 to ``port`` that counts the bytes the store sends back."""

    def __init__(self, port: int):
        self.target = port
        self.received = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if count:
                    with self._lock:
                        self.received += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def take(self) -> int:
        with self._lock:
            n, self.received = self.received, 0
        return n


def time_to_ranks(url: str, ranks: int) -> float:
    server = TensorBoardServer(sys.executable, url)
    try:
        return server.poll(f"/data/plugin/phaseprof/ranks?run={RUN}",
                           lambda b: len([r for r in json.loads(b)["ranks"] if r["steps"]]) == ranks, timeout=600)
    finally:
        server.close()


def cold_starts(url: str, ranks: int, repeat: int, relay: Relay, user_cache: str) -> tuple[float, float]:
    """Median seconds from TensorBoard's start to /ranks, and median bytes read from the store, over
    ``repeat`` starts, each with an empty user cache (nothing analysed earlier is at hand)."""
    relay.take()
    runs = []
    for _ in range(repeat):
        shutil.rmtree(user_cache, ignore_errors=True)
        os.environ["PHASEPROF_CACHE"] = user_cache
        runs.append((time_to_ranks(url, ranks), relay.take()))
    return median([r[0] for r in runs]), median([r[1] for r in runs])


def main() -> None:
    args = arguments(__doc__)
    os.environ.pop("PHASEPROF_CACHE", None)
    store = S3Server()
    store.start()
    relay = Relay(store.port)
    env = store.environment()
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{relay.port}", S3_ENDPOINT=f"http://127.0.0.1:{relay.port}")
    os.environ.update(env)
    user_cache = tempfile.mkdtemp(prefix="s3-bench-cache-")
    os.environ["PHASEPROF_CACHE"] = user_cache  # nothing from an earlier run's user cache
    try:
        print(f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; median of {args.repeat}")
        local = tempfile.mkdtemp(prefix="s3-bench-")
        rank_traces(local, args.ranks)
        del os.environ["PHASEPROF_CACHE"]
        write_summaries(local, linked=False)
        traces = sum(os.path.getsize(os.path.join(local, RUN, n)) for n in os.listdir(os.path.join(local, RUN))
                     if n.endswith(".gz"))
        store.client().create_bucket(Bucket="bench")
        store.upload_tree(local, "bench", "ranks")
        shutil.rmtree(local)
        seconds, read = cold_starts("s3://bench/ranks", args.ranks, args.repeat, relay, user_cache)
        print(f"{args.ranks} ranks with analyses, S3      start->/ranks {seconds:6.2f} s   "
              f"read {read / 1e6:.2f} MB of {traces / 1e6:.1f} MB of traces ({100 * read / traces:.1f}%)")

        if args.summaries:
            local = tempfile.mkdtemp(prefix="s3-bench-")
            os.makedirs(os.path.join(local, RUN))
            for r in range(args.summaries):
                name = f"rank{r}.node{r // 8}_{1000 + r}.1712170295000000000.pt.trace.json.gz"
                os.link(SMALL, os.path.join(local, RUN, name))
            os.environ.pop("PHASEPROF_CACHE", None)
            write_summaries(local, linked=True)
            store.upload_tree(local, "bench", "summaries")
            shutil.rmtree(local)
            seconds, read = cold_starts("s3://bench/summaries", args.summaries, args.repeat, relay, user_cache)
            print(f"{args.summaries} ranks of analyses, S3        start->/ranks {seconds:6.2f} s   "
                  f"read {read / 1e6:.1f} MB")
    finally:
        store.stop()
        shutil.rmtree(user_cache, ignore_errors=True)


if __name__ == "__main__":
    main()
