"""Collectives: each call with its message size and time, a table of them with nccl-tests' algorithm
and bus bandwidth, each rank's time as compute / communication / overlap / other, and the rank the
others wait for.

A call is a ``record_param_comms`` op (PyTorch wraps every c10d collective in one and records the
collective's name, element type, element counts and group size in its args), a backend op
(``nccl:_all_gather_base``) outside one (older PyTorch versions wrap only some collectives), or a
collective kernel (NCCL/RCCL/gloo by name) launched outside both. Its device work is what its runtime calls launched
under it (the launching call's outermost ``record_param_comms`` ancestor), as `span.communication`
counts it. Its kind is the recorded "Collective name", else the name of the backend op inside it
(``nccl:all_reduce``), else the kernel's (``ncclKernel_AllReduce_…``), spelled one way (`kind_of`).

Message size and bandwidth follow nccl-tests (``doc/PERFORMANCE.md``): size is the larger of the
input and output bytes (all_gather's output, reduce_scatter's input), algbw = size / time, busbw =
algbw × a factor for the kind and the group's n ranks: all_reduce 2(n-1)/n; all_gather,
reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send/recv 1. A call's time is its device work's
first start to last end (it includes waiting for the other ranks inside the kernel, as nccl-tests'
does), else its host range.

Across ranks, a collective is matched by its place in its process group: the traces' sequence
number ("Seq") where every call of the group records one, else (step number, group, place among the
step's calls of the group in host order). The rank whose call started last (device start, else host
start) arrived last: the others waited for it. This reads the ranks' clocks as one: true on one host,
and as far as the hosts' clocks agree otherwise.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from ..answers import (
    BreakdownStep,
    CollectiveRow,
    CollectivesAnswer,
    CollectiveWait,
    GpuBreakdown,
    RankBreakdown,
    WaitedFor,
)
from ..reading.columns import COMM_OP
from ..reading.events import Trace
from .model import CollectiveTable
from .nesting import Nesting
from .partition import Partition
from .worker import Worker, ms, phase_names, rank_order

#: Bytes per element of c10's scalar types, as ``record_param_comms`` names them.
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "QInt8": 1, "QUInt8": 1, "Short": 2, "Half": 2, "BFloat16": 2, "Int": 4,
    "Float": 4, "QInt32": 4, "Long": 8, "Double": 8, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
#: The backend op PyTorch runs inside ``record_param_comms`` (``nccl:all_reduce``).
_BACKEND_OP = re.compile(r"^(?:nccl|gloo|mpi|ucc|xccl):(\w+)")
#: A collective kernel's kind: ``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_AllGather_…``.
_KERNEL_KIND = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
#: The kinds nccl-tests has a bus-bandwidth factor for, by the words a name is made of.
_KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
          ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
          ("reduce", "reduce"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier"), ("gather", "gather"),
          ("scatter", "scatter"))


def kind_of(name: str) -> str:
    """One spelling per kind: ``allreduce``, ``all_reduce``, ``AllReduce`` -> ``all_reduce``;
    ``_allgather_base``, ``allgather_into_tensor_coalesced`` -> ``all_gather``; others as written."""
    squashed = name.lower().replace("_", "")
    for word, kind in _KINDS:
        if word in squashed:
            return kind
    return name.strip("_") or "collective"


def bus_factor(kind: str, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth factor for ``kind`` over ``ranks`` ranks (None: unknown)."""
    if ranks < 1:
        return None
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if kind in ("broadcast", "reduce", "send_recv", "send", "recv"):
        return 1.0
    return None


def message_bytes(dtype: str, in_nelems: int, out_nelems: int) -> int:
    """nccl-tests' size of one call: the larger of its input and output, in bytes (-1: unknown)."""
    size = DTYPE_BYTES.get(dtype)
    count = max(in_nelems, out_nelems)
    return count * size if size is not None and count >= 0 else -1


def _outermost_calls(n: Nesting, is_call: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, calls): per event of ``n``, its outermost call holding it (itself if it is one; -1:
    under no call); and the calls that no call holds, in nesting order (one row each)."""
    owner = np.where(is_call, np.arange(len(n.name)), -1)
    for d in range(1, int(n.depth.max(initial=0)) + 1):  # depth by depth: a parent's owner is known
        at = np.flatnonzero(n.depth == d)
        up = owner[n.parent[at]]
        owner[at] = np.where(up >= 0, up, owner[at])
    return owner, np.flatnonzero(is_call & (owner == np.arange(len(owner))))


def _backend_names(names: list[str], n: Nesting, is_backend: np.ndarray, owner: np.ndarray,
                   row_of: np.ndarray, calls: int) -> list[str]:
    """Per call row, the collective its first backend op names (``nccl:all_reduce``: "all_reduce");
    "" where it holds none."""
    backend = [""] * calls
    for i in np.flatnonzero(is_backend & (owner >= 0))[::-1].tolist():  # last write: the first op
        backend[row_of[owner[i]]] = _BACKEND_OP.match(names[n.name[i]]).group(1)
    return backend


def _call_of_device(owner: np.ndarray, row_of: np.ndarray, launch_runtime: np.ndarray,
                    devices: int) -> np.ndarray:
    """Per device event, the call row whose range holds the runtime call that launched it; -1 for
    work launched under no call, or by no known runtime call."""
    out = np.full(devices, -1, np.int64)
    known = launch_runtime >= 0
    if len(owner):
        under = owner[launch_runtime[known]]  # -1 (no call) must not index: it would read the last
        out[known] = np.where(under >= 0, row_of[np.maximum(under, 0)], -1)
    return out


def _device_times(call_of_dev: np.ndarray, ts: np.ndarray, dur: np.ndarray,
                  rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call row: its device work's first start and last end (NaN: none), and its kernel time
    (device time summed)."""
    on = np.flatnonzero(call_of_dev >= 0)
    start, end = np.full(rows, np.inf), np.full(rows, -np.inf)
    np.minimum.at(start, call_of_dev[on], ts[on])
    np.maximum.at(end, call_of_dev[on], ts[on] + dur[on])
    kernel = np.bincount(call_of_dev[on], weights=dur[on], minlength=rows).astype(np.float64)
    start[~np.isfinite(start)] = np.nan
    end[~np.isfinite(end)] = np.nan
    return start, end, kernel


def _place_in_group(step: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Each call's place among the calls of its step and process group (0, 1, …), for calls given
    in host order: how calls are matched across ranks when the trace records no sequence numbers."""
    by = np.lexsort((np.arange(len(step)), group, step))  # by step, then group, then host order
    if not len(by):
        return np.zeros(0, np.int64)
    first = np.r_[True, (step[by][1:] != step[by][:-1]) | (group[by][1:] != group[by][:-1])]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(by)), 0))
    order = np.empty(len(step), np.int64)
    order[by] = np.arange(len(by)) - run_start
    return order


def collective_table(trace: Trace, n: Nesting, part: Partition, launch_runtime: np.ndarray,
                     launch_ts: np.ndarray, comm: np.ndarray) -> CollectiveTable:
    """Each collective call of the span's steps (see the module's docstring); ``launch_runtime`` and
    ``launch_ts``: each device event's launching runtime call (index into ``n``, -1 unknown) and its
    start; ``comm``: which device events are communication (`span.communication`)."""
    names, dev = trace.names, trace.device
    rpc = {name: k for k, name in enumerate(names)}.get(COMM_OP, -1)
    backend_name = np.array([bool(_BACKEND_OP.match(name)) for name in names] or [False])
    is_backend = backend_name[n.name] if len(n.name) else np.zeros(0, dtype=bool)
    # a call: a record_param_comms op, or a backend op outside one (older PyTorch records no
    # record_param_comms around some collectives)
    owner, calls = _outermost_calls(n, (n.name == rpc) | is_backend)
    row_of = np.full(len(owner), -1, np.int64)  # per event: its row if it is a call (-1: not one)
    row_of[calls] = np.arange(len(calls))

    # rows: the calls, then each collective kernel launched under no call, a call of its own
    kinds: dict[str, int] = {}
    groups: dict[str, int] = {}
    args = [trace.comms[c] for c in trace.host.comm[n.order[calls]].tolist()]
    backend = _backend_names(names, n, is_backend, owner, row_of, len(calls))
    kind = [kinds.setdefault(kind_of(a.kind or b or "collective"), len(kinds))
            for a, b in zip(args, backend)]
    group = [groups.setdefault(a.group, len(groups)) for a in args]
    call_of_dev = _call_of_device(owner, row_of, launch_runtime, len(dev))
    alone = np.flatnonzero(comm & (call_of_dev < 0) & np.isfinite(launch_ts))
    call_of_dev[alone] = len(calls) + np.arange(len(alone))
    for i in alone.tolist():
        match = _KERNEL_KIND.match(names[dev.name[i]])
        kind.append(kinds.setdefault(kind_of(match.group(1)) if match else "collective", len(kinds)))
        group.append(groups.setdefault("", len(groups)))
        args.append(trace.comms[0])  # no recorded arguments: sizes unknown
    rows = len(calls) + len(alone)

    host_ts = np.r_[n.ts[calls], launch_ts[alone]]
    host_us = np.r_[n.dur[calls], np.zeros(len(alone))]
    start, end, kernel = _device_times(call_of_dev, dev.ts, dev.dur, rows)

    # the calls inside a step, in (step, host time) order
    step, phase = part.locate(host_ts)
    keep = np.flatnonzero(step >= 0)
    keep = keep[np.lexsort((host_ts[keep], step[keep]))]
    s, g = step[keep].astype(np.int64), np.array(group, np.int64)[keep]
    kept_args = [args[i] for i in keep.tolist()]
    return CollectiveTable(
        kinds=list(kinds),
        groups=list(groups),
        step=s.astype(np.int32),
        phase=phase[keep].astype(np.int32),
        kind=np.array(kind, np.int32)[keep] if rows else np.zeros(0, np.int32),
        group=g.astype(np.int32),
        group_size=np.array([a.group_size for a in kept_args], np.int64),
        seq=np.array([a.seq for a in kept_args], np.int64),
        order=_place_in_group(s, g),
        nbytes=np.array([message_bytes(a.dtype, a.in_nelems, a.out_nelems) for a in kept_args],
                        np.int64),
        host_ts=host_ts[keep],
        host_us=host_us[keep],
        device_start=start[keep],
        device_end=end[keep],
        kernel_us=kernel[keep],
    )


def call_us(t: CollectiveTable) -> np.ndarray:
    """Each call's time: its device work's first start to last end, else its host range."""
    return np.where(np.isnan(t.device_start), t.host_us, t.device_end - t.device_start)


def _gbps(nbytes: float, us: float) -> float:
    return round(nbytes / us / 1e3, 6)  # bytes per µs is 1e6 bytes/s


def collective_rows(w: Worker, rows: list[int]) -> list[CollectiveRow]:
    """The worker's collectives over its steps ``rows``, per (kind, group, group size, size, on GPU)."""
    sums: dict[tuple, list] = {}
    for span, _, indices in w.by_span(rows):
        t = span.collectives
        pick = np.flatnonzero(np.isin(t.step, indices))
        us = call_us(t)
        for i in pick.tolist():
            key = (t.kinds[t.kind[i]], t.groups[t.group[i]], int(t.group_size[i]), int(t.nbytes[i]),
                   not np.isnan(t.device_start[i]))
            acc = sums.setdefault(key, [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += float(us[i])
            acc[2] = max(acc[2], float(us[i]))
            acc[3] += float(t.kernel_us[i])
    out = []
    for (kind, group, size, nbytes, on_gpu), (calls, total, longest, kernel) in sums.items():
        factor = bus_factor(kind, size)
        algbw = _gbps(nbytes * calls, total) if nbytes >= 0 and total > 0 else None
        out.append(CollectiveRow(
            worker=w.name, rank=w.rank, kind=kind, group=group, group_size=size if size >= 0 else None,
            bytes=nbytes if nbytes >= 0 else None, calls=calls, time_ms=ms(total), mean_ms=ms(total / calls),
            max_ms=ms(longest), kernel_ms=ms(kernel), on_gpu=on_gpu, algbw_gbps=algbw,
            busbw_gbps=round(algbw * factor, 6) if algbw is not None and factor is not None else None))
    out.sort(key=lambda r: -r.time_ms)
    return out


def breakdown(w: Worker, rows: list[int], phases: list[str]) -> RankBreakdown:
    """The worker's time per step and phase as compute / communication / overlap / memory / other:
    the GPU measures of `span.gpu_measures` (`Worker.gpu_compute_us`, `comm_us`, `exposed_comm_us`,
    `exposed_memory_us`) and its GPU idle (`Worker.gpu_idle_us`), or, without a GPU, host time less
    the collectives' (as `ranks`)."""
    from .span import COLLECTIVE_OP  # the collective ops the ranks view counts (span imports this module)

    cols = w.columns(phases)
    r = np.array(rows, np.int64)

    def table(t: np.ndarray) -> np.ndarray:
        return np.where(cols >= 0, t[r][:, np.maximum(cols, 0)], 0.0) if len(phases) else np.zeros((len(r), 0))

    if w.has_gpu:
        compute, comm = table(w.gpu_compute_us), table(w.comm_us)
        overlap, other = comm - table(w.exposed_comm_us), np.nan_to_num(table(w.gpu_idle_us))
        memory = table(w.exposed_memory_us)
    else:
        cpu = table(w.host_us)
        comm = np.minimum(w.collective_us(r, phases, COLLECTIVE_OP.match), cpu)
        compute = cpu - comm
        overlap, other, memory = np.zeros_like(cpu), np.zeros_like(cpu), np.zeros_like(cpu)

    def cell(k: int, j: int | None) -> GpuBreakdown:
        pick = slice(None) if j is None else j
        return GpuBreakdown(compute_ms=ms(np.sum(compute[k, pick])), comm_ms=ms(np.sum(comm[k, pick])),
                            overlap_ms=ms(np.sum(overlap[k, pick])),
                            other_ms=ms(np.sum(other[k, pick])),
                            memory_ms=ms(np.sum(memory[k, pick])))

    steps = [BreakdownStep(step=w.numbers[row], total=cell(k, None),
                           phases={p: cell(k, j) for j, p in enumerate(phases)})
             for k, row in enumerate(rows)]
    return RankBreakdown(worker=w.name, rank=w.rank, measure="gpu" if w.has_gpu else "host", steps=steps)


#: Collectives listed in `CollectivesAnswer.waits`, the longest spreads first.
MAX_WAITS = 100


def collectives_answer(run: str, workers: list[Worker], worker: str | None, step: int | None) -> CollectivesAnswer:
    """The answer of ``/collectives`` for ``workers`` (the run's ranks): the table of ``worker`` (all
    workers when None), each rank's breakdown and, with two ranks or more, who waits for whom, over
    step ``step`` (every profiled step when None)."""
    workers = sorted(workers, key=lambda w: rank_order(w.rank, w.name))
    phases = phase_names([s for w in workers for s in w.spans])
    table, ranks = [], []
    chosen: dict[str, list[int]] = {}
    for w in workers:
        rows = w.full().tolist() if step is None else [k for k, number in enumerate(w.numbers) if number == step]
        chosen[w.name] = rows
        if worker is None or w.name == worker:
            table += collective_rows(w, rows)
        ranks.append(breakdown(w, rows, phases))
    waited, waits, matched, matched_by = _waits(workers, chosen)
    note = ("fewer than two ranks: no collective to match across ranks" if matched_by == "none" else
            f"{matched} collectives matched across {len(waited)} ranks by "
            f"{'sequence number' if matched_by == 'seq' else 'place in the step'}")
    return CollectivesAnswer(run=run, step=step, worker=worker, collectives=table, ranks=ranks,
                             waited_for=waited, waits=waits, matched_by=matched_by, note=note)


def _calls(w: Worker, rows: list[int]) -> list[tuple]:
    """A worker's calls over ``rows``: (step number, group, seq, order, kind, arrival µs)."""
    out = []
    for span, _, indices in w.by_span(rows):
        t = span.collectives
        arrival = np.where(np.isnan(t.device_start), t.host_ts, t.device_start)
        for i in np.flatnonzero(np.isin(t.step, indices)).tolist():
            out.append((span.steps[t.step[i]].number, t.groups[t.group[i]], int(t.seq[i]), int(t.order[i]),
                        t.kinds[t.kind[i]], float(arrival[i])))
    return out


def _waits(workers: list[Worker], chosen: dict[str, list[int]]) -> tuple[list[WaitedFor], list[CollectiveWait], int,
                                                                      str]:
    """Who waited for whom: per rank its tally, the longest waits, how many collectives matched, and how."""
    ranks = [w for w in workers if chosen[w.name]]
    if len(ranks) < 2:
        return [], [], 0, "none"
    calls = {w.name: _calls(w, chosen[w.name]) for w in ranks}
    by_seq = all(c[2] >= 0 for cs in calls.values() for c in cs)
    meet: dict[tuple, dict[str, tuple]] = defaultdict(dict)
    for name, cs in calls.items():
        for number, group, seq, order, kind, arrival in cs:
            key = (group, seq) if by_seq else (number, group, order)
            meet[key][name] = (number, kind, arrival)
    rank_of = {w.name: w.rank for w in ranks}
    tally = {w.name: [0, 0, 0.0] for w in ranks}
    waits = []
    for key, met in meet.items():
        if len(met) < 2 or len({kind for _, kind, _ in met.values()}) > 1:
            continue  # not one collective: a rank missing it, or calls of different kinds
        arrivals = {name: a for name, (_, _, a) in met.items()}
        last = max(arrivals, key=lambda name: (arrivals[name], rank_order(rank_of[name], name)))
        first = min(arrivals.values())
        for name in arrivals:
            tally[name][0] += 1
        tally[last][1] += 1
        tally[last][2] += sum(arrivals[last] - a for a in arrivals.values())
        number, kind, _ = next(iter(met.values()))
        waits.append(CollectiveWait(step=number, kind=kind, group=key[-2], position=key[-1], last_worker=last,
                                    last_rank=rank_of[last], spread_ms=ms(arrivals[last] - first),
                                    arrivals_ms={name: ms(a - first) for name, a in arrivals.items()}))
    waits.sort(key=lambda x: (-x.spread_ms, x.step, x.position))
    waited = [WaitedFor(worker=w.name, rank=w.rank, matched=tally[w.name][0], last=tally[w.name][1],
                        caused_ms=ms(tally[w.name][2])) for w in ranks]
    return waited, waits[:MAX_WAITS], len(waits), "seq" if by_seq else "order"
