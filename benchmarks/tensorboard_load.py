"""TensorBoard with phaseprof against torch-tb-profiler 0.4.3, side by side on the same >= 150 MB trace,
and the runs route on 200 runs x 2 workers.

    python benchmarks/tensorboard_load.py [--skip-peer]

1. TensorBoard start (process launch) to `/data/plugin/phaseprof/steps` answering with the steps,
   and TensorBoard's RSS once loaded (the decode runs in a worker process that exits when idle).
2. The same for torch-tb-profiler 0.4.3 (installed by this script into a throwaway virtual
   environment under benchmarks/.cache/): launch to its overview answering for that trace.
3. 200 runs x 2 workers of small real traces: time for the runs route to answer.

Targets: (1) <= 3 s and RSS <= 1.5x the file size; (3) < 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _measure import TensorBoardServer, tree_kib  # noqa: E402
from big_trace import CACHE, make  # noqa: E402

PEER_VENV = os.path.join(CACHE, "tb-profiler-venv")


@contextlib.contextmanager
def serving(python: str, logdir: str) -> Iterator[TensorBoardServer]:
    """TensorBoard (run by ``python``) on ``logdir``; stopped, and ``logdir`` removed, on leaving."""
    server = TensorBoardServer(python, logdir)
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(logdir)


def phaseprof_load(trace: str) -> None:
    logdir = tempfile.mkdtemp(prefix="tb-phaseprof-")
    os.makedirs(os.path.join(logdir, "big"))
    os.link(trace, os.path.join(logdir, "big", os.path.basename(trace)))
    size = os.path.getsize(trace) / 2**20
    with serving(sys.executable, logdir) as server:
        listed = server.poll("/data/plugins_listing", lambda b: json.loads(b).get("phaseprof", {}).get("enabled"))
        answered = server.poll("/data/plugin/phaseprof/steps?run=big", lambda b: len(json.loads(b)["steps"]) > 0)
        time.sleep(2)  # the loading pool shuts down when idle
        rss = server.rss_mib()
        tree = tree_kib(server.proc.pid, "Rss:") / 1024
        print(f"phaseprof          start->listed {listed:6.2f} s   start->steps {answered:6.2f} s   "
              f"TensorBoard RSS {rss:5.0f} MiB = {rss / size:4.2f}x the {size:.0f} MiB file "
              f"(with its data server {tree:.0f} MiB)")


def peer_python() -> str:
    python = os.path.join(PEER_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "torch-tb-profiler==0.4.3", "tensorboard"], check=True,
                       stderr=subprocess.DEVNULL)
    return python


def peer_load(trace: str) -> None:
    python = peer_python()
    logdir = tempfile.mkdtemp(prefix="tb-peer-")
    os.makedirs(os.path.join(logdir, "big"))
    os.link(trace, os.path.join(logdir, "big", os.path.basename(trace)))
    base = "/data/plugin/pytorch_profiler"
    with serving(python, logdir) as server:
        server.poll(f"{base}/runs", lambda b: "big" in json.loads(b).get("runs", []))
        workers = json.loads(server.get(f"{base}/workers?run=big&view=Overview")[1])
        spans = json.loads(server.get(f"{base}/spans?run=big&worker={workers[0]}")[1])
        span = f"&span={spans[0]}" if spans else ""
        answered = server.poll(f"{base}/overview?run=big&worker={workers[0]}{span}", lambda b: len(b) > 100)
        print(f"torch-tb-profiler  start->overview {answered:6.2f} s   TensorBoard RSS {server.rss_mib():5.0f} MiB")


def many_runs(runs: int = 200, workers: int = 2) -> None:
    small = small_trace()
    logdir = tempfile.mkdtemp(prefix="tb-many-")
    for r in range(runs):
        os.makedirs(os.path.join(logdir, f"run{r:03d}"))
        for w in range(workers):
            os.link(small, os.path.join(logdir, f"run{r:03d}", f"rank{w}.host_1.{10**18 + r}.pt.trace.json.gz"))
    with serving(sys.executable, logdir) as server:
        server.poll("/data/plugins_listing", lambda b: True)
        t = time.perf_counter()
        status, body = server.get("/data/plugin/phaseprof/runs")
        first = time.perf_counter() - t
        assert status == 200 and len(json.loads(body)["runs"]) == runs
        loaded = server.poll("/data/plugin/phaseprof/runs",
                             lambda b: (lambda d: d["loading"]["done"] == d["loading"]["files"])(json.loads(b)))
        t = time.perf_counter()
        server.get("/data/plugin/phaseprof/runs")
        warm = time.perf_counter() - t
        print(f"{runs} runs x {workers} workers: runs route {first * 1000:.0f} ms on first call, "
              f"{warm * 1000:.0f} ms once loaded; all {runs * workers} spans loaded {loaded:.1f} s after start")


def small_trace() -> str:
    """A small real trace: a few steps of a tiny model, written once."""
    path = os.path.join(CACHE, "small", "tiny.pt.trace.json.gz")
    if not os.path.exists(path):
        code = (
            "import torch, sys\n"
            "from torch.profiler import profile, schedule, tensorboard_trace_handler\n"
            "m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "with profile(schedule=schedule(wait=0, warmup=1, active=3),"
            " on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name='tiny', use_gzip=True)) as p:\n"
            "    for _ in range(4):\n"
            "        opt.zero_grad(); m(torch.randn(32, 64)).sum().backward(); opt.step(); p.step()\n"
        )
        out = tempfile.mkdtemp()
        subprocess.run([sys.executable, "-c", code, out], check=True, capture_output=True)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.move(os.path.join(out, os.listdir(out)[0]), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-peer", action="store_true", help="do not install and run torch-tb-profiler")
    args = parser.parse_args()
    trace, _ = make()
    print(f"trace {trace} ({os.path.getsize(trace) / 1e6:.1f} MB); {os.cpu_count()} CPUs")
    phaseprof_load(trace)
    if not args.skip_peer:
        peer_load(trace)
    many_runs()


if __name__ == "__main__":
    main()
