"""How long a capture takes, from the request to the first traced step and to the trace written.

    python benchmarks/capture_latency.py [--requests 5] [--steps 5]

For each job — one process stepping every 10 ms, one stepping every 100 ms, and two ranks under
torchrun (gloo) stepping every 20 ms — it asks ``--requests`` times, one after the other, with
``phaseprof capture --wait --steps N`` (a subprocess, as a user runs it), and measures, per request:
from the request's writing (its ``written`` field) to the start of the first traced step (the job
logs each step's start time), and to the last rank's answer that its trace is written. The target:
the first traced step within 2 s of the request (so the trace within 2 s plus N steps, plus the
export). The job is the test suite's (`tests.capture_job`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phaseprof.capture_channel import read_channel  # noqa: E402
from tests.capture_job import Job  # noqa: E402


def measure(name: str, requests: int, steps: int, **job_options) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(Path(tmp), active=steps, **job_options)
        try:
            job.ready()
            for _ in range(requests):
                asked = subprocess.run([sys.executable, "-m", "phaseprof.cli", "capture", str(job.logdir), "--wait",
                                        "--steps", str(steps)], capture_output=True, text=True, timeout=600)
                if asked.returncode != 0:
                    raise RuntimeError(asked.stdout + asked.stderr)
            job.finish()
        finally:
            job.kill()
        channel = read_channel(str(job.run_dir))
        starts = [job.starts(rank) for rank in range(job.ranks)]
        first, written, retried = [], [], 0
        for request in channel.requests:
            answers = channel.answers[request.id]
            if any(a.state != "written" for a in answers.values()):
                retried += 1  # a rank missed its start step: `phaseprof capture` asked again
                continue
            step = answers[0].first
            first.append(max(s[step] for s in starts) - request.written)
            written.append(max(a.updated for a in answers.values()) - request.written)
    step_ms = job_options.get("step_s", 0) * 1e3
    return (f"| {name} | {step_ms:.0f} ms | {len(first)} | {statistics.median(first):.2f} s "
            f"[{min(first):.2f}, {max(first):.2f}] | {statistics.median(written):.2f} s "
            f"[{min(written):.2f}, {max(written):.2f}] | {retried} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"python benchmarks/capture_latency.py --requests {args.requests} --steps {args.steps}   "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start)\n")
    print(f"| job | step | captures | request to first traced step, median [range] | request to trace written "
          f"({args.steps} steps and the export) | asked again (missed) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, options in [("1 process", dict(step_s=0.01)), ("1 process", dict(step_s=0.1)),
                          ("2 ranks, torchrun, gloo", dict(step_s=0.02, ranks=2))]:
        print(measure(name, args.requests, args.steps, **options), flush=True)
    print(f"\n(load average {os.getloadavg()[0]:.2f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
