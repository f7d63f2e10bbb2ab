"""The Holistic Trace Analysis side of hta_agreement.py: run only by the Python of HTA's own venv
(never imported by phaseprof or its tests), it prints one JSON object of HTA's figures for the trace
files named on its command line, each read alone as HTA reads a trace folder.

    /tmp/hta-venv/bin/python benchmarks/_hta_side.py REQUEST.json

REQUEST.json maps each trace file's path to phaseprof's step windows there (host start and end, µs
on the trace's clock): the per-step figures are taken over the same windows.

Per file: HTA's own figures as its API states them (temporal breakdown, kernel-type breakdown
with memory kernels, communication/computation overlap, queue length summary, launch statistics,
idle time breakdown, per-kernel totals), and from HTA's own event tables the same ones phaseprof
states by another definition (queue length weighted by time over the steps' host windows, launch
delay from the runtime call's start), so the table can show where only the definition differs.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import warnings

import numpy as np
import pandas as pd
from hta.trace_analysis import TraceAnalysis

#: HTA's threshold under which a gap between queued kernels is "kernel wait": its default, 30, which
#: its docs call ns but which it compares with its frames' µs.
KERNEL_WAIT = 30


def _figures(path: str, steps: list[list[float]]) -> dict:
    folder = tempfile.mkdtemp(prefix="hta-")
    try:
        shutil.copy(path, folder)
        hta = TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
        (rank,) = hta.t.get_ranks()
        df = hta.t.get_trace(rank)
        out: dict = {"rank": int(rank), "steps": [int(s) for s in hta.get_profiler_steps()]}
        temporal = hta.get_temporal_breakdown(visualize=False).iloc[0]
        out["busy_us"] = float(temporal["kernel_time(us)"] - temporal["idle_time(us)"])
        out["compute_us"] = float(temporal["compute_time(us)"])
        out["idle_pct"] = float(temporal["idle_time_pctg"])
        types, kernels = hta.get_gpu_kernel_breakdown(
            visualize=False, include_memory_kernels=True, num_kernels=10_000, duration_ratio=1.0
        )
        for kind in ("COMMUNICATION", "MEMORY"):
            held = types[types["kernel_type"].str.contains(kind)]
            out[f"{kind.lower()}_us"] = float(held["sum"].sum())
        out["kernels_us"] = {str(r["name"]): float(r["sum (us)"]) for _, r in kernels.iterrows()}
        overlap = hta.get_comm_comp_overlap(visualize=False)
        out["overlap_pct"] = (
            float(overlap["comp_comm_overlap_pctg"].iloc[0]) if out["communication_us"] else None
        )
        windows = [(a - hta.t.min_ts, b - hta.t.min_ts) for a, b in steps]
        out["queues"] = _queues(hta, df, windows, rank)
        out["delays"] = _delays(hta, df, windows, rank)
        out["idle_split"] = _idle_split(hta, df, rank)
        return out
    finally:
        shutil.rmtree(folder)


def _stream_of(df: pd.DataFrame) -> pd.Series:
    """Each device event's stream as phaseprof labels it (device from HTA's pid column)."""
    return "GPU " + df["pid"].astype(str) + " stream " + df["stream"].astype(str)


def _queues(hta, df, windows, rank) -> dict:
    """Per stream: HTA's summary (mean and max over the series' change points, as
    ``get_queue_length_summary`` states them, over the whole trace), and per step window the
    series' mean weighted by time and its max there (phaseprof's definition, on HTA's series)."""
    summary = hta.get_queue_length_summary(ranks=[rank])
    series = hta.get_queue_length_time_series(ranks=[rank]).get(rank)
    out: dict = {}
    if summary is None or series is None:
        return out
    labels = dict(zip(df["stream"], _stream_of(df)))
    for stream, s in series.groupby("stream"):
        row = summary.loc[(rank, stream)]
        s = s.sort_values("ts", kind="stable")
        t, q = s["ts"].to_numpy(float), s["queue_length"].to_numpy(float)
        means, maxima = [], []
        for a, b in windows:
            inside = (t > a) & (t < b)
            edges = np.r_[a, t[inside], b]
            k = (
                np.searchsorted(t, edges[:-1], side="right") - 1
            )  # the value in force from each edge
            values = np.where(k >= 0, q[np.maximum(k, 0)], 0.0)
            means.append(float(np.sum(values * np.diff(edges)) / (b - a)))
            maxima.append(float(values.max(initial=0.0)))
        out[labels.get(stream, f"stream {stream}")] = {
            "hta_mean": float(row[("queue_length", "mean")]),
            "hta_max": float(row[("queue_length", "max")]),
            "step_mean": means,
            "step_max": maxima,
        }
    return out


def _delays(hta, df, windows, rank) -> dict:
    """Per stream and step window: launch delay median and p90 as HTA defines it (kernel start
    less the runtime call's end, ``get_cuda_kernel_launch_stats``) and from the call's start
    (phaseprof's), of the work launched in the window (None where none)."""
    stats = hta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
    device = df[df["stream"].ne(-1)][["correlation", "stream", "pid", "ts"]]
    host = df[df["stream"].eq(-1) & df["correlation"].ge(0)][["correlation", "ts"]]
    joined = stats.merge(device.rename(columns={"ts": "start"}), on="correlation").merge(
        host, on="correlation"
    )
    joined["label"] = _stream_of(joined)
    # from HTA's event times: its ``launch_delay`` is clipped at 0 (a kernel starting before its
    # call returns), so the call's duration added back would not give the start-to-start delay
    joined["from_start"] = joined["start"] - joined["ts"]
    out: dict = {}
    for label, g in joined.groupby("label"):
        figures = {key: [] for key in ("hta_p50", "hta_p90", "p50", "p90")}
        for a, b in windows:
            w = g[(g["ts"] >= a) & (g["ts"] < b)]
            for key, column, p in (
                ("hta_p50", "launch_delay", 50),
                ("hta_p90", "launch_delay", 90),
                ("p50", "from_start", 50),
                ("p90", "from_start", 90),
            ):
                figures[key].append(float(np.percentile(w[column], p)) if len(w) else None)
        out[label] = figures
    return out


def _idle_split(hta, df, rank) -> dict:
    """Per stream: HTA's idle time breakdown (µs: host wait, kernel wait, other)."""
    split, _ = hta.get_idle_time_breakdown(
        ranks=[rank], visualize=False, consecutive_kernel_delay=KERNEL_WAIT
    )
    labels = dict(zip(df["stream"], _stream_of(df)))
    out: dict = {}
    for _, r in split.iterrows():
        label = labels.get(r["stream"], f"stream {r['stream']}")
        out.setdefault(label, {})[str(r["idle_category"])] = float(r["idle_time"])
    return out


def main() -> None:
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    with open(sys.argv[1]) as f:
        request = json.load(f)
    result = {path: _figures(path, steps) for path, steps in request.items()}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
