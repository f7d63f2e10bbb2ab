"""Decoded events into columns: host, device and memory events as numpy arrays, names as codes.

One Python loop groups events by category (`trace_schema`); every column is then pulled out of a
group by C-level iteration. Values that decoded but cannot be held (integers past 64 bits,
impossible times, numbers written as text) are caught here, column by column, and counted.
"""

from __future__ import annotations

from operator import attrgetter

import msgspec
import numpy as np

from .events import KERNEL, OP, RUNTIME, CommArgs, fits_dims, pack_dims
from .lenient import to_int
from .problems import Problems
from .trace_fields import NO_ARGS, Event
from .trace_schema import DEVICE_KINDS, HOST_KINDS, INSTANT_CATEGORIES, KNOWN_PHASES, MEMORY_EVENT

#: Timestamps and durations beyond this (µs; ~3,000 years) are not times.
MAX_US = 1e17
_INT64_MAX = (1 << 63) - 1


class Part:
    """Columns decoded from one part of a file, with the part's own string tables."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.shapes: dict[bytes, int] = {b"": 0}
        self.comms: dict[CommArgs, int] = {CommArgs(): 0}
        self.threads: dict[tuple, int] = {}
        self.thread_labels: dict[tuple, str] = {}
        self.memory_devices: dict[tuple[int, int], int] = {}
        self.rank: int | None = None
        self.world_size: int | None = None
        self.gpu_names: list[str] = []
        self.gpu_capabilities: list[str] = []  # "major.minor" per GPU, "" where not given
        self.cpus: int | None = None
        self.problems = Problems()
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, np.ndarray] = {}
        self.memory: dict[str, np.ndarray] = {}


_CAT = attrgetter("cat")
_PH = attrgetter("ph")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_NAME = attrgetter("name")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_ARGS = attrgetter("args")
# Getters of the args: read from a group's args, listed once (``attrgetter("args.x")`` over the
# events costs twice as much per column as ``attrgetter("x")`` over their args).
_CORRELATION = attrgetter("correlation")
_INPUT_DIMS = attrgetter("input_dims")
_SEQUENCE = attrgetter("sequence")
_NBYTES = attrgetter("nbytes")
_TOTAL = attrgetter("total_allocated")
_RESERVED = attrgetter("total_reserved")
_DEVICE_TYPE = attrgetter("device_type")
_DEVICE_ID = attrgetter("device_id")
_STREAM = attrgetter("stream")
_BLOCKS_PER_SM = attrgetter("blocks_per_sm")
_OCCUPANCY = attrgetter("occupancy")
_REGISTERS = attrgetter("registers")
_SHARED_MEMORY = attrgetter("shared_memory")
_GRID = attrgetter("grid")
_BLOCK = attrgetter("block")
_ADDR = attrgetter("addr")
#: What an op's args hold when the trace records no input shapes (the same object in every such event).
_NO_DIMS = NO_ARGS.input_dims
#: The op PyTorch wraps each c10d collective in, with its message sizes in its args.
COMM_OP = "record_param_comms"


def fill_columns(part: Part, events: list[Event], positions: list[int] | None, shapes: bool = True) -> None:
    """Sort the decoded events into host, device and memory columns.

    One Python loop groups events by category; every column is then pulled out of a group by
    C-level iteration (``map`` + ``attrgetter`` into ``np.fromiter``), several times cheaper than
    appending field by field in a loop over hundreds of thousands of events.
    """
    groups: dict[str, list[Event]] = {}
    get = groups.get
    for e in events:
        group = get(e.cat)
        if group is None:
            group = groups[e.cat] = []
        group.append(e)

    problems = part.problems
    problems.events, problems.positions = events, positions
    host: list[dict[str, np.ndarray]] = []
    device: list[dict[str, np.ndarray]] = []
    memory: list[Event] = []
    for cat, group in groups.items():
        if cat is None:  # the typed pass's events of phases the reader does not use (`trace_fields`)
            continue
        phases = set(map(_PH, group))
        if not phases <= KNOWN_PHASES:
            bad = phases - KNOWN_PHASES
            problems.add([e for e in group if e.ph in bad], "has an unknown phase type 'ph'")
            group = [e for e in group if e.ph not in bad]
        if "M" in phases:
            for e in group:
                if e.ph == "M" and e.name == "thread_name" and e.args.name:
                    part.thread_labels[(e.pid, _thread_id(e.tid))] = e.args.name
        if cat in INSTANT_CATEGORIES:
            if phases <= _MEMORY_PHASES and set(map(_NAME, group)) == {MEMORY_EVENT}:
                memory.extend(group)  # today's: nothing but [memory] instants
            else:
                memory.extend(e for e in group if e.name == MEMORY_EVENT and e.ph in _MEMORY_PHASES)
        if cat in HOST_KINDS or cat in DEVICE_KINDS:
            if phases != {"X"}:
                group = [e for e in group if e.ph == "X" and e.name != MEMORY_EVENT]
            if cat == "":  # no category: legacy export's operators, or stray span markers
                group = [e for e in group if not isinstance(e.pid, str) or e.pid == "CPU functions"]
            group, ts, dur = _valid_complete(group, problems)
            if group:
                if cat in HOST_KINDS:
                    host.append(_host_columns(group, ts, dur, HOST_KINDS[cat], part, shapes))
                else:
                    device.append(_device_columns(group, ts, dur, DEVICE_KINDS[cat], part))
    part.host = _concat(host, _HOST_COLUMNS)
    part.device = _concat(device, _DEVICE_COLUMNS)
    part.memory = _memory_columns(memory, part, problems)
    problems.events = problems.positions = None  # not sent back from a child process


#: The phases a `[memory]` event may be written with (an instant; a complete event in old traces).
_MEMORY_PHASES = frozenset("XiI")


def _valid_complete(group: list[Event], problems: Problems) -> tuple[list[Event], np.ndarray, np.ndarray]:
    """The group without complete events that lack a start or a duration or have a negative or
    impossible one, with its start and duration columns."""
    ts = np.fromiter(map(_TS, group), np.float64, len(group))
    dur = np.fromiter(map(_DUR, group), np.float64, len(group))
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(ts) < MAX_US) | ~(dur < MAX_US) | (dur < 0) | np.isnan(dur)
    if not bad.any():
        return group, ts, dur
    keep = ~bad
    for what, rows in (
        ("has no 'ts'", np.isnan(ts)),
        ("has no 'dur'", np.isnan(dur)),
        ("has a negative duration", dur < 0),
        ("has a 'ts' or 'dur' out of range", bad & ~np.isnan(ts) & ~np.isnan(dur) & ~(dur < 0)),
    ):
        problems.add([group[i] for i in np.flatnonzero(rows & bad).tolist()], what)
        bad &= ~rows
    return [e for e, k in zip(group, keep.tolist()) if k], ts[keep], dur[keep]


_HOST_COLUMNS = {"ts": np.float64, "dur": np.float64, "thread": np.int32, "name": np.int32,
                 "kind": np.int8, "corr": np.int64, "shapes": np.int32, "comm": np.int32,
                 "seq": np.int64}
_DEVICE_COLUMNS = {"ts": np.float64, "dur": np.float64, "device": np.int32, "stream": np.int64,
                   "name": np.int32, "kind": np.int8, "corr": np.int64, "blocks_per_sm": np.float64,
                   "occupancy": np.float64, "registers": np.int64, "shared_memory": np.int64, "grid": np.int64,
                   "block": np.int64}


def _host_columns(group: list[Event], ts, dur, kind: int, part: Part, shapes: bool) -> dict[str, np.ndarray]:
    n = len(group)
    args = list(map(_ARGS, group)) if kind in (OP, RUNTIME) else None
    names = _codes(list(map(_NAME, group)), part.names)
    return {
        "ts": ts,
        "dur": dur,
        "thread": _thread_codes(group, part.threads),
        "name": names,
        "kind": np.full(n, kind, np.int8),
        "corr": (_int_column(group, args, _CORRELATION, -1, 0, _INT64_MAX, part.problems, "correlation")
                 if kind == RUNTIME else np.full(n, -1, np.int64)),
        "shapes": _shape_codes(args, part.shapes) if kind == OP and shapes else np.zeros(n, np.int32),
        "comm": _comm_codes(group, names, part) if kind == OP else np.zeros(n, np.int32),
        "seq": (_int_column(group, args, _SEQUENCE, -1, 0, _INT64_MAX, part.problems, "sequence number")
                if kind == OP else np.full(n, -1, np.int64)),
    }


def _shape_codes(args: list, table: dict) -> np.ndarray:
    """Each op's input shapes coded in ``table`` (0: none recorded; most traces record none)."""
    dims = list(map(_INPUT_DIMS, args))
    if dims.count(_NO_DIMS) == len(dims):
        return np.zeros(len(dims), np.int32)
    return _codes(list(map(bytes, dims)), table)


def _comm_codes(group: list[Event], names: np.ndarray, part: Part) -> np.ndarray:
    """Per event, the code of its collective's args in ``part.comms`` (0: not a
    ``record_param_comms``); ``names``: the events' name codes, which find those ops in C."""
    out = np.zeros(len(group), np.int32)
    code = part.names.get(COMM_OP)
    if code is not None:
        table = part.comms
        for i in np.flatnonzero(names == code).tolist():
            out[i] = table.setdefault(comm_args(group[i].args), len(table))
    return out


def comm_args(a) -> CommArgs:
    """A collective's args, each read leniently (a value of an odd type counts as not recorded)."""
    def number(v) -> int:
        v = to_int(v)
        return v if v is not None and v >= 0 else -1

    def text(v) -> str:
        return v if isinstance(v, str) else ""

    group = text(a.group_name) or (str(number(a.group_id)) if number(a.group_id) >= 0 else "")
    return CommArgs(kind=text(a.collective), dtype=text(a.dtype), in_nelems=number(a.in_nelems),
                    out_nelems=number(a.out_nelems), group_size=number(a.group_size), group=group,
                    seq=number(a.seq))


def _device_columns(group: list[Event], ts, dur, kind: int, part: Part) -> dict[str, np.ndarray]:
    n = len(group)
    args = list(map(_ARGS, group))
    stream = _int_column(group, args, _STREAM, -1, -1, _INT64_MAX, part.problems, "stream id")
    for i in np.flatnonzero(stream < 0).tolist():  # no "stream" arg: the tid is the stream (2021: "stream 7")
        number = to_int(group[i].tid)
        stream[i] = number if number is not None and number >= 0 else 0
    return {
        "ts": ts,
        "dur": dur,
        "device": _int_column(group, group, _PID, 0, 0, (1 << 31) - 1, part.problems, "device id",
                              strings=False).astype(np.int32),
        "stream": stream,
        "name": _codes(list(map(_NAME, group)), part.names),
        "kind": np.full(n, kind, np.int8),
        "corr": _int_column(group, args, _CORRELATION, -1, 0, _INT64_MAX, part.problems, "correlation"),
        **(_launch_columns(group, args, part.problems) if kind == KERNEL else _no_launch(n)),
    }


def _no_launch(n: int) -> dict[str, np.ndarray]:
    """The launch columns of copies and sets: not recorded."""
    return {"blocks_per_sm": np.full(n, np.nan), "occupancy": np.full(n, np.nan), "registers": np.full(n, -1),
            "shared_memory": np.full(n, -1), "grid": np.full(n, -1), "block": np.full(n, -1)}


#: Most launch figures a kernel's args can hold (beyond: not a figure, counted as a problem).
_MAX_BLOCKS_PER_SM = 1e9


def _launch_columns(group: list[Event], args: list, problems: Problems) -> dict[str, np.ndarray]:
    """A kernel's launch as Kineto records it: blocks per SM, estimated achieved occupancy (%),
    registers per thread, shared memory per block, grid and block (`pack_dims`)."""
    n = len(group)
    blocks = np.fromiter(map(_BLOCKS_PER_SM, args), np.float64, n)
    occupancy = np.fromiter(map(_OCCUPANCY, args), np.float64, n)
    with np.errstate(invalid="ignore"):
        for column, hi, what in ((blocks, _MAX_BLOCKS_PER_SM, "blocks per SM"),
                                 (occupancy, 100.0, "est. achieved occupancy %")):
            bad = ~((column >= 0) & (column <= hi)) & ~np.isnan(column)
            if bad.any():
                problems.degrade_events([group[i] for i in np.flatnonzero(bad).tolist()], f"{what} is out of range")
                column[bad] = np.nan
    # a whole block on every SM has some occupancy: 0 there is Kineto's "could not compute it" (its
    # calculator fails on cutlass's large dynamic shared memory and on NCCL kernels), not 0%
    occupancy[(occupancy == 0) & (blocks >= 1)] = np.nan
    return {
        "blocks_per_sm": blocks,
        "occupancy": occupancy,
        "registers": _int_column(group, args, _REGISTERS, -1, 0, 1 << 16, problems, "registers per thread"),
        "shared_memory": _int_column(group, args, _SHARED_MEMORY, -1, 0, 1 << 40, problems, "shared memory"),
        "grid": _dims_column(group, args, _GRID, problems, "grid"),
        "block": _dims_column(group, args, _BLOCK, problems, "block"),
    }


def _dims_column(group: list[Event], args: list, get, problems: Problems, what: str) -> np.ndarray:
    """A grid or block ([x, y, z]) per event, packed (`pack_dims`); each distinct text is parsed once
    (launch shapes repeat: a step holds thousands of kernels and a few dozen shapes)."""
    texts = list(map(bytes, map(get, args)))
    table: dict[bytes, int] = {}
    codes = _codes(texts, table)
    packed = np.full(len(table), -1, np.int64)
    unreadable = []
    for text, code in table.items():
        if not text:
            continue
        try:
            dims = msgspec.json.decode(text)
        except msgspec.DecodeError:
            dims = None
        if fits_dims(dims):
            packed[code] = pack_dims(*dims)
        else:
            unreadable.append(code)
    if unreadable:
        bad = np.isin(codes, unreadable)
        problems.degrade_events([group[i] for i in np.flatnonzero(bad).tolist()], f"{what} is not [x, y, z]")
    return packed[codes] if len(codes) else np.empty(0, np.int64)


def _int_column(group: list[Event], source: list, get, default: int, lo: int, hi: int, problems: Problems,
                what: str, strings: bool = True) -> np.ndarray:
    """One integer field of every event as an int64 column, read by ``get`` from ``source`` (the
    events, or their args, in the same order). Values the fast conversion refuses (strings,
    integers past 64 bits) are read one by one; those outside ``[lo, hi]`` (other than
    ``default``, meaning "not given") become ``default`` and are counted. ``strings=False``: a
    string means "not given" too (a device event's process named by a string)."""
    n = len(group)
    try:
        column = np.fromiter(map(get, source), np.int64, n)
    except (OverflowError, TypeError, ValueError):
        values = list(map(get, source))
        unreadable, too_large = [], []
        out = []
        for i, v in enumerate(values):
            number = to_int(v) if strings or not isinstance(v, str) else default
            if number is None:
                (too_large if isinstance(v, int) else unreadable).append(group[i])
                number = default
            out.append(number)
        problems.degrade_events(unreadable, f"{what} is not a number")
        problems.degrade_events(too_large, f"{what} is out of range")
        column = np.array(out, dtype=np.int64)
    bad = ((column < lo) | (column > hi)) & (column != default)
    if bad.any():
        problems.degrade_events([group[i] for i in np.flatnonzero(bad).tolist()], f"{what} is out of range")
        column[bad] = default
    return column


def _memory_columns(events: list[Event], part: Part, problems: Problems) -> dict[str, np.ndarray]:
    n = len(events)
    ts = np.fromiter(map(_TS, events), np.float64, n)
    nbytes = np.fromiter(map(_NBYTES, map(_ARGS, events)), np.float64, n)
    bad = ~(np.abs(ts) < MAX_US) | ~(np.abs(nbytes) < 2.0**62)
    if bad.any():
        what = "[memory] event without a usable 'ts' or 'Bytes'"
        problems.add([events[i] for i in np.flatnonzero(bad).tolist()], what)
        keep = ~bad
        events = [e for e, k in zip(events, keep.tolist()) if k]
        ts, nbytes, n = ts[keep], nbytes[keep], int(keep.sum())
    args = list(map(_ARGS, events))
    device_type = _int_column(events, args, _DEVICE_TYPE, 0, 0, 65535, problems, "Device Type")
    device_id = _int_column(events, args, _DEVICE_ID, -1, -1, 65534, problems, "Device Id")
    keys, codes = np.unique(device_type * 65536 + device_id + 1, return_inverse=True)
    local = np.array(
        [part.memory_devices.setdefault((int(k) // 65536, int(k) % 65536 - 1), len(part.memory_devices)) for k in keys],
        dtype=np.int32,
    )
    total = np.fromiter(map(_TOTAL, args), np.float64, n)
    total[~(np.abs(total) < 2.0**62)] = -1
    reserved = np.fromiter(map(_RESERVED, args), np.float64, n)
    reserved[~(np.abs(reserved) < 2.0**62)] = -1
    addr = _addresses(args)
    return {
        "ts": ts,
        "nbytes": nbytes.astype(np.int64),
        "total": total.astype(np.int64),
        "reserved": reserved.astype(np.int64),
        "device": local[codes.ravel()] if n else np.empty(0, np.int32),
        "addr": addr,
        "thread": _thread_codes(events, part.threads) if n else np.empty(0, np.int32),
    }


def _addresses(args: list) -> np.ndarray:
    """Each [memory] event's address as an int64 (-1: none readable, see `to_int`), converted in
    one call when every address is a plain integer (the usual case), else one by one."""
    values = list(map(_ADDR, args))
    if set(map(type, values)) <= {int}:
        try:
            return np.fromiter(values, np.int64, len(values))
        except OverflowError:  # past 64 bits
            pass
    return np.array([a if (a := to_int(v)) is not None else -1 for v in values], np.int64)


def _concat(groups: list[dict[str, np.ndarray]], columns: dict[str, type]) -> dict[str, np.ndarray]:
    if not groups:
        return {k: np.empty(0, dtype) for k, dtype in columns.items()}
    if len(groups) == 1:
        return groups[0]
    return {k: np.concatenate([g[k] for g in groups]) for k in columns}


def _codes(values: list, table: dict) -> np.ndarray:
    """Code each value as its index in ``table`` (extended with values not seen before, in order of
    first appearance: codes, and every tie broken by them, never depend on the string hash seed)."""
    for v in dict.fromkeys(values):
        if v not in table:
            table[v] = len(table)
    return np.fromiter(map(table.__getitem__, values), np.int32, len(values))


def _thread_id(tid: int | str) -> int | str:
    if isinstance(tid, str) and tid.isascii() and tid.isdigit() and len(tid) <= 18:
        return int(tid)  # 2021 writes "25738"
    return tid


def _thread_codes(events: list[Event], table: dict) -> np.ndarray:
    try:  # the common case: numeric ids, often a single thread
        pids = np.fromiter(map(_PID, events), np.int64, len(events))
        tids = np.fromiter(map(_TID, events), np.int64, len(events))
    except (TypeError, ValueError, OverflowError):
        keys = list(zip(map(_PID, events), map(_TID, events)))
        local = {key: table.setdefault((key[0], _thread_id(key[1])), len(table)) for key in dict.fromkeys(keys)}
        return np.fromiter(map(local.__getitem__, keys), np.int32, len(keys))
    if (pids == pids[0]).all() and (tids == tids[0]).all():
        return np.full(len(events), table.setdefault((int(pids[0]), int(tids[0])), len(table)), np.int32)
    # one 1-D key per (pid, tid) pair: sorting rows of a 2-D array (np.unique's axis=0) costs
    # several times as much, a fifth of all the column work on a trace of a few threads
    upids, pid_codes = np.unique(pids, return_inverse=True)
    utids, tid_codes = np.unique(tids, return_inverse=True)
    keys, inverse = np.unique(pid_codes.ravel() * len(utids) + tid_codes.ravel(), return_inverse=True)
    local = np.array([table.setdefault((int(upids[k // len(utids)]), int(utids[k % len(utids)])), len(table))
                      for k in keys.tolist()], dtype=np.int32)
    return local[inverse.ravel()]
