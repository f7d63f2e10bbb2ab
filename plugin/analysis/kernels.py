"""Device work by kernel name: how often each ran, how long, which op and phase launched it.

The table is built once per span (`kernel_table`) from the same launch attribution as the phase
figures, so a step's kernels add up to that step's GPU time, phase by phase.
"""

from __future__ import annotations

import re

import numpy as np

from ..answers import KernelRow, KernelsAnswer
from ..reading.events import KERNEL, MEMCPY, MEMSET, Trace, unpack_dims
from .model import KernelTable
from .worker import Worker

KINDS = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset"}
#: Device work of collectives (NCCL/RCCL/gloo kernels) is communication by its name.
COLLECTIVE_KERNEL = re.compile(r"nccl|rccl|gloo", re.I)

#: Kernels of matrix products and convolutions (cuBLAS, cuDNN, CUTLASS, xmma) ...
MATRIX_KERNEL = re.compile(r"gemm|conv|dgrad|wgrad|winograd|scudnn|hcudnn|cutlass|xmma|fft", re.I)
#: ... run on tensor cores when their name says so: an MMA instruction family (``hmma``/``imma``,
#: ``wmma``, Hopper's ``wgmma``/``gmma``), CUTLASS's ``tensorop`` kernels, or cuBLAS/cuDNN's tile
#: shapes of the MMA instructions (``h884``, ``s1688``, ``i8816``, ``16816``: 8x8x4, 16x8x8, 16x8x16) ...
_TENSOR_CORE_NAME = re.compile(r"hmma|imma|wgmma|gmma|wmma|tensorop|[hsi]884|[hsi]1688|[hsi]?16816|i8816", re.I)
#: ... or, for a matrix kernel, an input precision only tensor cores take in a matrix product
#: (``tf32``, ``f16``/``bf16``/``half``, fp8's ``e4m3``/``e5m2``). A float32 matrix kernel whose name
#: says none of these (``volta_sgemm_…``, ``sm80_xmma_gemm_f32f32_f32f32_f32_…``) runs on the CUDA cores.
_TENSOR_CORE_PRECISION = re.compile(r"tf32|bf16|f16|half|fp8|e4m3|e5m2", re.I)


def uses_tensor_cores(name: str) -> bool:
    """Whether a kernel runs on tensor cores, as far as its name tells (the trace records no flag:
    Kineto's kernel args hold the launch, not the instructions). A heuristic: a kernel that does not
    say so in its name (a Triton kernel, a custom one) counts as not using them."""
    return bool(_TENSOR_CORE_NAME.search(name)
                or (MATRIX_KERNEL.search(name) and _TENSOR_CORE_PRECISION.search(name)))


def kernel_table(trace: Trace, owner: np.ndarray, dev_step: np.ndarray, dev_phase: np.ndarray) -> KernelTable:
    """Group the device events of ``trace`` by (step, phase, name, launching op, kind).

    ``owner`` is the name code of the op that launched each device event (-1 where unknown);
    ``dev_step`` / ``dev_phase`` its step index and phase code by launch (-1 outside every step).
    """
    dev = trace.device
    keep = dev_step >= 0
    nn = max(len(trace.names), 1)
    parts = (dev_step[keep].astype(np.int64), dev_phase[keep].astype(np.int64), dev.name[keep].astype(np.int64),
             owner[keep].astype(np.int64) + 1, dev.kind[keep].astype(np.int64))
    radix = (max(int(dev_step.max(initial=0)) + 1, 1), max(int(dev_phase.max(initial=0)) + 1, 1), nn, nn + 1, 3)
    key = np.zeros(int(keep.sum()), dtype=np.int64)
    for column, size in zip(parts, radix):
        key = key * size + column
    unique, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.ravel()
    dur = dev.dur[keep]
    count = len(unique)
    # the longest call of each group: the last of its calls in (group, duration) order
    order = np.lexsort((dur, inverse))
    longest = order[np.searchsorted(inverse[order], np.arange(count), "right") - 1] if count else order
    max_us = dur[longest]
    weighted = {}
    for column in ("blocks_per_sm", "occupancy"):
        value = getattr(dev, column)[keep]
        known = ~np.isnan(value)
        weight = np.where(known, dur, 0.0)
        weighted[f"{column}_us"] = np.bincount(inverse, weights=np.where(known, value, 0.0) * weight, minlength=count)
        weighted[f"{column}_weight_us"] = np.bincount(inverse, weights=weight, minlength=count)
    fields = []
    rest = unique
    for size in reversed(radix):
        fields.append(rest % size)
        rest = rest // size
    kind, op, name, phase, step = fields
    return KernelTable(
        step=step.astype(np.int32), phase=phase.astype(np.int32), name=name.astype(np.int32),
        op=(op - 1).astype(np.int32), kind=kind.astype(np.int8),
        calls=np.bincount(inverse, minlength=count).astype(np.int64),
        us=np.bincount(inverse, weights=dur, minlength=count), max_us=max_us, **weighted,
        **{column: getattr(dev, column)[keep][longest] for column in ("grid", "block", "registers", "shared_memory")},
    )


def kernel_rows(w: Worker, rows: list[int], phase: str | None = None) -> tuple[list[KernelRow], float]:
    """Kernels of the steps ``rows`` of worker ``w`` (launched in ``phase``, or in any), most GPU time
    first, and the GPU time they add up to (µs). Blocks per SM and occupancy are means weighted by
    each call's duration (over the calls that recorded them); grid, block, registers and shared
    memory are those of the longest call."""
    acc: dict[tuple[str, str], dict] = {}
    for span, _, indices in w.by_span(rows):
        t = span.kernels
        rows = np.isin(t.step, indices)
        if phase is not None:
            rows &= t.phase == (span.phases.index(phase) if phase in span.phases else -2)
        for k in np.flatnonzero(rows).tolist():
            name, kind = span.names[t.name[k]], KINDS[int(t.kind[k])]
            entry = acc.setdefault((name, kind), {"calls": 0, "total": 0.0, "max": -1.0, "ops": {}, "phases": {},
                                                  "weighted": [0.0] * 4})
            total = float(t.us[k])
            entry["calls"] += int(t.calls[k])
            entry["total"] += total
            if t.max_us[k] > entry["max"]:  # the launch shown is the longest call's
                entry["max"] = float(t.max_us[k])
                entry["launch"] = [int(getattr(t, c)[k]) for c in ("grid", "block", "registers", "shared_memory")]
            for i, column in enumerate((t.blocks_per_sm_us, t.blocks_per_sm_weight_us, t.occupancy_us,
                                        t.occupancy_weight_us)):
                entry["weighted"][i] += float(column[k])
            op = span.names[t.op[k]] if t.op[k] >= 0 else "(unknown)"
            entry["ops"][op] = entry["ops"].get(op, 0.0) + total
            p = span.phases[t.phase[k]]
            entry["phases"][p] = entry["phases"].get(p, 0.0) + total
    gpu = sum(e["total"] for e in acc.values())
    out = []
    for (name, kind), e in acc.items():
        ops = sorted(e["ops"], key=lambda o: -e["ops"][o])
        phases = sorted(e["phases"], key=lambda p: -e["phases"][p])
        blocks, blocks_weight, occupancy, occupancy_weight = e["weighted"]
        grid, block, registers, shared = e["launch"]
        out.append(KernelRow(
            name=name, kind=kind, calls=e["calls"], total_us=_us(e["total"]), mean_us=_us(e["total"] / e["calls"]),
            max_us=_us(e["max"]), share=round(e["total"] / gpu, 4) if gpu else 0.0, op=ops[0], phase=phases[0],
            ops=ops, phases=phases,
            blocks_per_sm=round(blocks / blocks_weight, 3) if blocks_weight > 0 else None,
            occupancy=round(occupancy / occupancy_weight, 2) if occupancy_weight > 0 else None,
            grid=unpack_dims(grid), block=unpack_dims(block), registers=registers if registers >= 0 else None,
            shared_memory=shared if shared >= 0 else None,
            # a collective's kernel is communication, not compute: no tensor cores to tell of
            tensor_cores=(uses_tensor_cores(name)
                          if kind == "kernel" and not COLLECTIVE_KERNEL.search(name) else None),
        ))
    out.sort(key=lambda r: (-r.total_us, r.name))
    return out, gpu


#: What a kernel table can be sorted by (``phaseprof report --kernels --sort``): the row's field.
SORT_KEYS = {"total": "total_us", "mean": "mean_us", "max": "max_us", "calls": "calls", "occupancy": "occupancy",
             "blocks-per-sm": "blocks_per_sm", "registers": "registers", "shared-memory": "shared_memory",
             "name": "name"}


def sort_kernels(rows: list[KernelRow], by: str) -> list[KernelRow]:
    """``rows`` by one of `SORT_KEYS`: largest first (names in order), rows without the figure last,
    ties by most GPU time."""
    field = SORT_KEYS[by]
    if field == "name":
        return sorted(rows, key=lambda r: (r.name, -r.total_us))
    known = [r for r in rows if getattr(r, field) is not None]
    return (sorted(known, key=lambda r: (-getattr(r, field), -r.total_us, r.name))
            + sorted((r for r in rows if getattr(r, field) is None), key=lambda r: (-r.total_us, r.name)))


def kernels_answer(run: str, w: Worker, rows: list[int], step: int | None, phase: str | None) -> KernelsAnswer:
    """`kernel_rows` as the answer of ``/kernels`` and ``phaseprof report --kernels``."""
    rows, left_out, why = w.run_wide(rows) if step is None else (rows, [], None)
    kernels, gpu_us = kernel_rows(w, rows, phase)
    return KernelsAnswer(run=run, worker=w.name, step=step, phase=phase, steps=len(rows), gpu_us=_us(gpu_us),
                         kernels=kernels, left_out=left_out, left_out_why=why)


def _us(value: float) -> float:
    """µs rounded to the nanosecond."""
    return round(float(value), 3)
