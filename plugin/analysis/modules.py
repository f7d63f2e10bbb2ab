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
    by_depth = np.argsort(-m.depth, kind="stable")  # one sort, then a slice per depth
    for at in np.split(by_depth, np.flatnonzero(np.diff(m.depth[by_depth])) + 1):
        if m.depth[at[0]] == 0:
            break
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
    """Each module's own name (with ``chained``, its record's name: its path is its parent's path
    and this name joined by a dot, `module_paths`), the modules in order of first call, each call's
    module, and each module's parent (the module of the call around its first call).

    A module is its parent module and its own name, so no path is built here: built for every call,
    the paths of records nested 10,000 deep held 50 million names."""
    label_of: dict[int, str] = {}
    up = m.parent.tolist()
    call_module = [0] * len(up)
    index: dict[tuple[int, str] | str, int] = {}
    labels: list[str] = []
    parents: list[int] = []
    for i in np.argsort(m.ts, kind="stable").tolist():  # a call's parent sorts before it
        code = int(m.name[i])
        label = label_of.get(code)
        if label is None:
            label = label_of[code] = names[code][len(prefix):]
        parent = call_module[up[i]] if up[i] >= 0 else -1
        key = (parent, label) if chained else label
        k = index.get(key)
        if k is None:
            k = index[key] = len(labels)
            labels.append(label)
            parents.append(parent)
        call_module[i] = k
    return labels, np.array(call_module, np.int32), np.array(parents, np.int32)


#: A module path of more records than this is shown by its first and last `_KEPT` records.
_LONGEST = 32
_KEPT = 8


def module_paths(t: ModuleTable) -> list[str]:
    """Each module's path: its name for phaseprof's ranges; for the trace's module records, the
    record names from the outermost down joined by dots, paths deeper than `_LONGEST` records cut
    to their first and last `_KEPT` with the count left out between (``A_0.….…40 more….Z_0``), so
    that records nested thousands deep keep answers linear in the depth."""
    if t.source != FROM_RECORDS:
        return list(t.paths)
    out: list[str] = []
    count: list[int] = []  # records in each module's path
    head: list[str] = []  # its first _KEPT records
    tail: list[tuple[str, ...]] = []  # its last _KEPT records
    for label, up in zip(t.paths, t.parent.tolist()):
        if up < 0 or up >= len(out):  # parents come first; a forged table's are cut off
            n, first, last, path = 1, label, (label,), label
        else:
            n = count[up] + 1
            first = f"{head[up]}.{label}" if n <= _KEPT else head[up]
            last = (tail[up] + (label,))[-_KEPT:]
            path = (f"{out[up]}.{label}" if n <= _LONGEST
                    else f"{first}.…{n - 2 * _KEPT} more….{'.'.join(last)}")
        out.append(path)
        count.append(n)
        head.append(first)
        tail.append(last)
    return out


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
        paths = module_paths(t)
        for k in np.flatnonzero(np.isin(t.step, indices)).tolist():
            m = int(t.module[k])
            path = paths[m]
            parent = paths[int(t.parent[m])] if t.parent[m] >= 0 else None
            e = acc.setdefault(path, {"parent": parent, "calls": 0, "figures": [0.0] * 5, "ops": {}})
            e["calls"] += int(t.calls[k])
            for f, column in enumerate((t.forward_us, t.forward_self_us, t.forward_gpu_us, t.backward_us,
                                        t.backward_gpu_us)):
                e["figures"][f] += float(column[k])
        for k in np.flatnonzero(np.isin(t.op_step, indices)).tolist():
            e = acc.get(paths[int(t.op_module[k])])
            if e is None:
                continue
            op = e["ops"].setdefault((span.names[int(t.op_name[k])], bool(t.op_backward[k])), [0, 0.0, 0.0])
            op[0] += int(t.op_calls[k])
            op[1] += float(t.op_us[k])
            op[2] += float(t.op_gpu_us[k])
    n = max(len(rows), 1)
    depths = _depths(acc)
    out = []
    for path, e in acc.items():
        fwd, fwd_self, fwd_gpu, bwd, bwd_gpu = e["figures"]
        depth = depths[path]
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


def _depths(acc: dict[str, dict]) -> dict[str, int]:
    """Each path's depth: how many parents up its chain are listed, at most 256 (parents merged
    from several spans may form a loop). Each chain is walked once: depths are kept as found."""
    depths: dict[str, int] = {}
    for path in acc:
        chain: list[str] = []
        seen: set[str] = set()
        up: str | None = path
        while up is not None and up in acc and up not in depths and up not in seen:
            chain.append(up)
            seen.add(up)
            up = acc[up]["parent"]
        # the chain ends above the listed paths, at a path of known depth, or in a loop
        base = -1 if up is None or up not in acc else depths.get(up, 256)
        for k, p in enumerate(reversed(chain)):
            depths[p] = min(base + 1 + k, 256)
    return depths
