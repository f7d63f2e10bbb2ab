"""Which ``nn.Module`` takes the time: each module's forward and backward, host and GPU, and its ops.

A module's calls come from one of two records, the first found:

* phaseprof's own ranges (``PhaseProfiler(modules=True)``): a ``phaseprof.module::<path>`` range
  around each call, named by the module's qualified name (`phaseprof.contract.MODULE_RANGE_PREFIX`);
* torch.profiler's module records (``with_modules=True`` or ``with_stack=True``): ``nn.Module:
  <Class>_<n>`` Python events; a module's path is the chain of records around it
  (``Net_0.Sequential_0.Linear_1``: torch names instances by class and count, not by attribute).

Forward: a call's host time is its record's duration; its GPU time is the device work launched from
inside it. Backward has no record (autograd runs the gradient functions outside any module, on CUDA
builds from its own thread), so it is attributed through the autograd link the trace keeps: each
backward op (``autograd::engine::evaluate_function: …``) carries the sequence number of the forward
op that made it, and that op lies inside a module's call. A module's figures include its children's
(as its record holds theirs); ``self`` leaves the children out. Ops are listed under the innermost
module: a forward op that no op of the same module encloses, a backward op by its forward's module.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import MODULE_RANGE_PREFIX

from ..answers import ModuleOp, ModuleRow, ModulesAnswer
from ..reading.events import ANNOTATION, OP, Trace
from .model import ModuleTable, no_modules
from .nesting import Nesting, nest
from .partition import Partition
from .stacks import MODULE_RECORD, enclosing
from .steps import ms
from .worker import Worker

#: Where a span's module calls came from (`ModuleTable.source`).
FROM_RANGES = "phaseprof ranges"
FROM_RECORDS = "trace module records"
#: Backward ops: one per gradient function the engine ran.
_BACKWARD_OP = "autograd::engine::evaluate_function: "


def module_range_names(names: list[str]) -> np.ndarray:
    """Per name code: whether it names a module range (`phaseprof.contract.MODULE_RANGE_PREFIX`)."""
    return np.array([s.startswith(MODULE_RANGE_PREFIX) for s in names] or [False])


def module_table(trace: Trace, n: Nesting, part: Partition, launch_runtime: np.ndarray,
                 gpu_us: np.ndarray) -> ModuleTable:
    """The module table of one span. ``launch_runtime``: per device event, the runtime call (index into
    ``n``) that launched it, -1 unknown; ``gpu_us``: per host event of ``n``, the device time it and its
    children launched."""
    names = trace.names
    is_range = module_range_names(names)
    # written as a user annotation or (torch's fast range) as an op
    ranges = ((n.kind == ANNOTATION) | (n.kind == OP)) & is_range[n.name] if len(n.name) else np.zeros(0, bool)
    if ranges.any():
        calls = trace.host.take(n.order[ranges])
        source, prefix, chained = FROM_RANGES, MODULE_RANGE_PREFIX, False
    else:
        records = np.array([s.startswith(MODULE_RECORD) for s in names] or [False])
        py = trace.python
        calls = py.take(records[py.name]) if len(py.name) else py
        source, prefix, chained = FROM_RECORDS, MODULE_RECORD, True
    if not len(calls.ts):
        return no_modules()
    m = nest(calls)
    paths, call_module, parent = _paths(m, names, prefix, chained)
    calls_step, _ = part.locate(m.ts)

    # forward: the device work launched from inside each call (its innermost one)
    around = enclosing(m, n.thread, n.ts)  # per host event: the innermost call around its start
    dev_dur = trace.device.dur
    launched = launch_runtime >= 0
    by_call = around[launch_runtime[launched]] if len(around) else np.zeros(0, np.int64)
    fwd_gpu = np.bincount(by_call[by_call >= 0], weights=dev_dur[launched][by_call >= 0], minlength=len(m.ts))

    # backward: each gradient function, by the call around the forward op of the same sequence number
    evaluate = np.array([s.startswith(_BACKWARD_OP) for s in names] or [False])
    seq = trace.host.seq[n.order] if len(n.order) else np.zeros(0, np.int64)
    is_op = n.kind == OP
    backward = is_op & evaluate[n.name] & (seq >= 0) if len(n.name) else np.zeros(0, bool)
    forward = is_op & ~evaluate[n.name] & (seq >= 0) & (around >= 0) if len(n.name) else np.zeros(0, bool)
    fwd_rows = np.flatnonzero(forward)
    fwd_rows = fwd_rows[np.argsort(n.ts[fwd_rows], kind="stable")]
    keys, first = np.unique(seq[fwd_rows], return_index=True)
    bwd_rows = np.flatnonzero(backward)
    pos = np.minimum(np.searchsorted(keys, seq[bwd_rows]), max(len(keys) - 1, 0))
    found = (pos < len(keys)) & (keys[pos] == seq[bwd_rows]) if len(keys) else np.zeros(len(bwd_rows), bool)
    bwd_rows = bwd_rows[found]
    bwd_call = around[fwd_rows[first[pos[found]]]] if len(keys) else np.zeros(0, np.int64)
    bwd = np.bincount(bwd_call, weights=n.dur[bwd_rows], minlength=len(m.ts))
    bwd_gpu = np.bincount(bwd_call, weights=gpu_us[bwd_rows], minlength=len(m.ts))

    # a call's figures hold its children's: add each depth into the one above, deepest first
    child_us = np.bincount(m.parent[m.parent >= 0], weights=m.dur[m.parent >= 0], minlength=len(m.ts))
    for d in range(int(m.depth.max()), 0, -1):
        at = np.flatnonzero(m.depth == d)
        for column in (fwd_gpu, bwd, bwd_gpu):
            np.add.at(column, m.parent[at], column[at])

    inside = calls_step >= 0
    key, inverse = np.unique(calls_step[inside].astype(np.int64) * len(paths) + call_module[inside],
                             return_inverse=True)
    inverse = inverse.ravel()

    def total(column: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=column[inside], minlength=len(key))

    # ops: forward ops no op of the same call encloses, backward ops by their forward's call
    op_like = ((n.kind == OP) | (n.kind == ANNOTATION)) & ~ranges & ~part.marker_names[n.name] & ~backward
    up = n.parent
    outer = (up < 0) | ~op_like[np.maximum(up, 0)] | (around[np.maximum(up, 0)] != around)
    fwd_ops = np.flatnonzero(op_like & outer & (around >= 0))
    op_call = np.r_[around[fwd_ops], bwd_call].astype(np.int64)
    op_rows = np.r_[fwd_ops, bwd_rows].astype(np.int64)
    op_back = np.r_[np.zeros(len(fwd_ops), bool), np.ones(len(bwd_rows), bool)]
    op_step = calls_step[op_call] if len(op_call) else np.zeros(0, np.int32)
    keep = op_step >= 0
    op_call, op_rows, op_back, op_step = op_call[keep], op_rows[keep], op_back[keep], op_step[keep]
    op_key = ((op_step.astype(np.int64) * len(paths) + call_module[op_call]) * max(len(names), 1)
              + n.name[op_rows]) * 2 + op_back
    okey, oinv = np.unique(op_key, return_inverse=True)
    oinv = oinv.ravel()
    rest, back = okey // 2, okey % 2
    return ModuleTable(
        source=source, paths=paths, parent=parent,
        step=(key // len(paths)).astype(np.int32), module=(key % len(paths)).astype(np.int32),
        calls=np.bincount(inverse, minlength=len(key)).astype(np.int64),
        forward_us=total(m.dur), forward_self_us=total(np.clip(m.dur - child_us, 0.0, m.dur)),
        forward_gpu_us=total(fwd_gpu), backward_us=total(bwd), backward_gpu_us=total(bwd_gpu),
        op_step=(rest // max(len(names), 1) // len(paths)).astype(np.int32),
        op_module=(rest // max(len(names), 1) % len(paths)).astype(np.int32),
        op_name=(rest % max(len(names), 1)).astype(np.int32), op_backward=back.astype(bool),
        op_calls=np.bincount(oinv, minlength=len(okey)).astype(np.int64),
        op_us=np.bincount(oinv, weights=n.dur[op_rows], minlength=len(okey)),
        op_gpu_us=np.bincount(oinv, weights=gpu_us[op_rows], minlength=len(okey)),
    )


def _paths(m: Nesting, names: list[str], prefix: str, chained: bool) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Each call's module path (its own name, or with ``chained`` the names of the calls around it
    joined by dots), the paths in order of first call, each call's path index, and each path's parent
    (the path of the call around its first call)."""
    label = [names[int(c)][len(prefix):] for c in m.name.tolist()]
    path: list[str] = [""] * len(label)
    for i in np.argsort(m.depth, kind="stable").tolist():  # parents before children
        up = int(m.parent[i])
        path[i] = f"{path[up]}.{label[i]}" if chained and up >= 0 else label[i]
    index: dict[str, int] = {}
    parents: list[int] = []
    call_module = np.zeros(len(path), np.int32)
    for i in np.argsort(m.ts, kind="stable").tolist():
        if path[i] not in index:
            index[path[i]] = len(index)
            up = int(m.parent[i])
            parents.append(index.get(path[up], -1) if up >= 0 else -1)
        call_module[i] = index[path[i]]
    return list(index), call_module, np.array(parents, np.int32)


def modules_answer(run: str, w: Worker, rows: list[int], step: int | None) -> ModulesAnswer:
    """The modules of the steps ``rows`` of worker ``w``, summed over them by path; each module's ops,
    most time first. ``step``: the step number asked for, None for all profiled steps (less the
    warm-up and compiling steps, `Worker.run_wide`)."""
    rows, left_out, why = w.run_wide(rows) if step is None else (rows, [], None)
    acc: dict[str, dict] = {}
    sources: set[str] = set()
    forward_us = 0.0
    for span, _, indices in w.by_span(rows):
        t = span.modules
        j = span.phases.index("forward") if "forward" in span.phases else None
        if j is not None:
            forward_us += float(span.host_us[indices, j].sum())
        if t.source:
            sources.add(t.source)
        for k in np.flatnonzero(np.isin(t.step, indices)).tolist():
            m = int(t.module[k])
            path = t.paths[m]
            parent = t.paths[int(t.parent[m])] if t.parent[m] >= 0 else None
            e = acc.setdefault(path, {"parent": parent, "calls": 0, "figures": [0.0] * 5, "ops": {}})
            e["calls"] += int(t.calls[k])
            for f, column in enumerate((t.forward_us, t.forward_self_us, t.forward_gpu_us, t.backward_us,
                                        t.backward_gpu_us)):
                e["figures"][f] += float(column[k])
        for k in np.flatnonzero(np.isin(t.op_step, indices)).tolist():
            e = acc.get(t.paths[int(t.op_module[k])])
            if e is None:
                continue
            op = e["ops"].setdefault((span.names[int(t.op_name[k])], bool(t.op_backward[k])), [0, 0.0, 0.0])
            op[0] += int(t.op_calls[k])
            op[1] += float(t.op_us[k])
            op[2] += float(t.op_gpu_us[k])
    n = max(len(rows), 1)
    out = []
    for path, e in acc.items():
        fwd, fwd_self, fwd_gpu, bwd, bwd_gpu = e["figures"]
        depth, up = 0, e["parent"]
        while up is not None and up in acc and depth < 256:
            depth, up = depth + 1, acc[up]["parent"]
        ops = [ModuleOp(name=name, backward=back, calls=calls, host_ms=ms(us), gpu_ms=ms(gpu))
               for (name, back), (calls, us, gpu) in e["ops"].items()]
        ops.sort(key=lambda o: (-(o.host_ms + o.gpu_ms), o.name))
        out.append(ModuleRow(
            path=path, parent=e["parent"], depth=depth, calls=e["calls"], forward_ms=ms(fwd),
            forward_self_ms=ms(fwd_self), forward_gpu_ms=ms(fwd_gpu), backward_ms=ms(bwd), backward_gpu_ms=ms(bwd_gpu),
            forward_ms_per_step=ms(fwd / n), backward_ms_per_step=ms(bwd / n), ops=ops))
    out.sort(key=lambda r: (-(r.forward_ms + r.backward_ms), r.path))
    return ModulesAnswer(run=run, worker=w.name, step=step, steps=len(rows), source=" and ".join(sorted(sources)),
                         forward_phase_ms=ms(forward_us), has_gpu=w.has_gpu, modules=out, left_out=left_out,
                         left_out_why=why)
