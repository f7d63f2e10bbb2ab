"""How fast `phaseprof report --json` reads a >= 150 MB trace, against the typed-decode floor and
json.load, measured side by side in one run (each in its own process, median of --repeat runs);
and how fast a second report of it is, answered from the analysis cache.

    python benchmarks/report_speed.py [--repeat 3]

The report and the floor run alternately, and each row gives wall seconds and the CPU seconds of
the process and its children: on a shared machine the CPU figures are the steadier ones.

The floor decodes the same file into msgspec structs holding only the core fields of a trace event
(ph, cat, name, pid, tid, ts, dur, id, and the args External id, correlation, Bytes, Total Allocated,
Device Type, Device Id), with the garbage collector off: no analysis at all. Targets: report end to
end <= 1.2x the floor on both files, measured quiet; peak memory <= 1.5x the file size (the
floor itself peaks at ~2.4x); a second report (the cache beside the trace warm) < 0.3 s as a whole
process.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _measure import median, peak_mib, timed  # noqa: E402
from big_trace import make  # noqa: E402

FLOOR = r"""
import gc, gzip, sys, time
import msgspec
from msgspec import field

class Args(msgspec.Struct, gc=False):
    external_id: int | None = field(default=None, name="External id")
    correlation: int | None = None
    nbytes: float | None = field(default=None, name="Bytes")
    total: float | None = field(default=None, name="Total Allocated")
    device_type: int | None = field(default=None, name="Device Type")
    device_id: int | None = field(default=None, name="Device Id")

class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: Args | None = None

class Trace(msgspec.Struct, gc=False):
    traceEvents: list[Event]

gc.disable()
with open(sys.argv[1], "rb") as fh:
    data = fh.read()
if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
events = msgspec.json.Decoder(Trace).decode(data).traceEvents
print(len(events))
"""

JSON_LOAD = r"""
import gzip, json, sys
opener = gzip.open if sys.argv[1].endswith(".gz") else open
with opener(sys.argv[1], "rb") as fh:
    print(len(json.load(fh)["traceEvents"]))
"""


#: The first read of a trace: the analysis cache neither read nor written.
NO_CACHE = {"PHASEPROF_CACHE": "off"}


def _run(cmd: list[str], env: dict | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, result = timed(cmd, os.path.dirname(cmd[-1]), env)  # cwd: not the checkout, whose
    if result.returncode != 0:  # package metadata would leak into the peer's environment
        raise SystemExit(f"{cmd} failed: {result.stderr.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rows: dict[str, tuple[list[str], dict | None]], size_mb: float,
            repeat: int) -> list[dict]:
    """Each command of ``rows`` run ``repeat`` times, the commands alternating (a machine whose
    load changes meanwhile weighs on each alike); medians of wall and CPU seconds, peak memory."""
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in rows}
    for _ in range(repeat):
        for label, (cmd, env) in rows.items():
            runs[label].append(_run(cmd, env))
    out = []
    for label, (cmd, env) in rows.items():
        t = median([w for w, _ in runs[label]])
        peak = peak_mib(cmd, os.path.dirname(cmd[-1]), env=env)
        out.append({"label": label, "seconds": t, "cpu": median([c for _, c in runs[label]]),
                    "mb_per_s": size_mb / t, "peak_mib": peak})
    return out


def load() -> str:
    if not os.path.exists("/proc/loadavg"):
        return "?"
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-json-load", action="store_true", help="json.load takes ~6 s a run")
    args = parser.parse_args()
    plain, packed = make()
    py = sys.executable
    # the console script users run, installed beside this Python
    phaseprof = os.path.join(os.path.dirname(py), "phaseprof")
    plain_mb = os.path.getsize(plain) / 1e6
    print(f"trace: {plain} ({plain_mb:.1f} MB), gzipped {os.path.getsize(packed) / 1e6:.1f} MB; "
          f"{os.cpu_count()} CPUs; median of {args.repeat}; load average {load()}")
    print(f"{'input':8} {'what':26} {'seconds':>8} {'MB/s':>8} {'x floor':>8} {'CPU s':>7} "
          f"{'x floor':>8} {'peak MiB':>9} {'x file':>7}")
    for name, path in (("plain", plain), ("gzip", packed)):
        report = [phaseprof, "report", "--json", path]
        floor_cmd = [py, "-c", FLOOR, path]
        rows = measure({"phaseprof report --json": (report, NO_CACHE),
                        "typed-decode floor": (floor_cmd, None)}, plain_mb, args.repeat)
        if not args.skip_json_load:
            rows += measure({"json.load": ([py, "-c", JSON_LOAD, path], None)}, plain_mb, 1)
        timed(report, os.path.dirname(path))  # fills the cache beside the trace
        rows += measure({"second report (cached)": (report, None)}, plain_mb, args.repeat)
        floor, floor_cpu = rows[1]["seconds"], rows[1]["cpu"]
        for r in rows:
            print(f"{name:8} {r['label']:26} {r['seconds']:8.3f} {r['mb_per_s']:8.1f} {r['seconds'] / floor:8.2f} "
                  f"{r['cpu']:7.3f} {r['cpu'] / floor_cpu:8.2f} {r['peak_mib']:9.0f} "
                  f"{r['peak_mib'] * 2**20 / 1e6 / plain_mb:7.2f}")
    print(f"load average at the end {load()}")
    print("MB/s and x file are relative to the uncompressed size; CPU s: user + system time of the")
    print("process and its children (the decoding child too); peak MiB: PSS of the process tree.")


if __name__ == "__main__":
    main()
