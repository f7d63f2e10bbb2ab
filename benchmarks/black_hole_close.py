"""How long ``close()`` takes when the store accepts connections and never answers.

    python benchmarks/black_hole_close.py [--runs 1] [--steps 6]

The store is a TCP listener on 127.0.0.1 that accepts every connection and never sends a byte
(`tests.s3.BlackHole`), set as ``AWS_ENDPOINT_URL`` as a user would set an S3-compatible endpoint.
Each run trains a small model in a fresh process with ``PhaseProfiler(logdir="s3://bucket/prof")``
(one traced cycle, and one more that ``close()`` writes), and times ``close()``. It then checks that
the run's files were kept in the staging folder the summary names.

Target: close() returns within the documented bound, 60 s of uploads after the traces and their
analyses are done (docs/training-hooks.md, "A logdir in an object store"), where it used to block
for minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.s3 import BlackHole  # noqa: E402

RUN = textwrap.dedent("""
    import json, sys, time, warnings
    import torch
    from phaseprof import PhaseProfiler

    steps = int(sys.argv[1])
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    warnings.simplefilter("ignore")
    prof = PhaseProfiler(logdir="s3://bucket/prof", run="r", wait=0, warmup=1, active=2, repeat=2)
    prof.attach(model, optimizer)
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    start = time.perf_counter()
    prof.close()
    print(json.dumps({"close_s": time.perf_counter() - start}))
""")


def one_run(endpoint: str, steps: int) -> tuple[float, int, bool]:
    """close()'s seconds, the files kept in the staging folder, whether the summary named it."""
    with tempfile.TemporaryDirectory() as temp:
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "benchmark",
               "AWS_SECRET_ACCESS_KEY": "benchmark", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true", "PHASEPROF_STAGING": temp}
        done = subprocess.run([sys.executable, "-c", RUN, str(steps)], env=env, capture_output=True,
                              text=True, timeout=1800, start_new_session=True)
        if done.returncode != 0:
            raise SystemExit(f"the training process failed:\n{done.stderr}")
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["close_s"]
        kept = sum(len(files) for _, _, files in os.walk(temp))
        named = any(f"The run is staged in {os.path.join(temp, name)}" in done.stdout
                    for name in os.listdir(temp))
        return seconds, kept, named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6, help="steps before close (default 6)")
    args = parser.parse_args()
    hole = BlackHole()
    try:
        times = []
        for i in range(args.runs):
            seconds, kept, named = one_run(hole.endpoint, args.steps)
            times.append(seconds)
            named = "named" if named else "NOT named"
            print(f"run {i + 1}: close() {seconds:.1f} s; {kept} file(s) kept in the staging "
                  f"folder, {named} by the summary; {hole.accepted} connection(s) accepted so far, "
                  "none answered")
    finally:
        hole.close()
    print(f"close() against a black hole: median {statistics.median(times):.1f} s, "
          f"max {max(times):.1f} s over {len(times)} run(s)")


if __name__ == "__main__":
    main()
