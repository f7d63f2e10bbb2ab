"""The event-by-event pass, for files the typed pass refuses because of a value of the wrong type.

Each event is decoded on its own: with the typed struct where it fits, else with every field taken
as it comes and checked here. A field that cannot be read is dropped from its event (``correlation
is not a number``), or the event is skipped (``dur is not a number``); both are counted. This pass
is several times slower than the typed one and runs only on files that need it.
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import field

from phaseprof.contract import CPUS_KEY

from .file_bytes import TraceError
from .problems import Problems
from .trace_fields import ARGS_DECODER, EVENT_DECODER, NAN, NO_ARGS, Args, Event

if TYPE_CHECKING:
    from .columns import Part

class _LooseObject(msgspec.Struct, gc=False):
    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: Any = None
    deviceProperties: Any = None
    cpus: Any = field(default=None, name=CPUS_KEY)


class _LooseEvent(msgspec.Struct, gc=False):
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw(b"")


#: The fields of `Args`, each checked here as its type says.
_ARGS_FIELDS = msgspec.structs.fields(Args)
#: `Args` with every field taken as it comes (raw JSON stays raw), UNSET where the event has none:
#: derived from it, so a field added there is read here too.
_LooseArgs = msgspec.defstruct(
    "_LooseArgs",
    [(f.name, f.type if f.type is msgspec.Raw else Any,
      field(default=f.default if f.type is msgspec.Raw else msgspec.UNSET, name=f.encode_name)) for f in _ARGS_FIELDS],
    gc=False)
#: How a problem names a field (default: its name in the trace, or in words).
_SAID = {"stream": "stream id", "registers": "registers per thread"}


_LOOSE_OBJECT = msgspec.json.Decoder(_LooseObject)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_LOOSE_EVENT = msgspec.json.Decoder(_LooseEvent)
_LOOSE_ARGS = msgspec.json.Decoder(_LooseArgs)



def decode_leniently(data, path: str, part: Part, bare_list: bool, deadline: float):
    if bare_list:
        raws = _RAW_LIST.decode(data)
    else:
        obj = _LOOSE_OBJECT.decode(data)
        if not len(obj.traceEvents):
            raise TraceError(path, "a JSON object without a 'traceEvents' list")
        try:
            raws = _RAW_LIST.decode(obj.traceEvents)
        except msgspec.ValidationError:
            raise TraceError(path, "'traceEvents' is not a list") from None
        info = obj.distributedInfo if isinstance(obj.distributedInfo, dict) else {}
        part.rank = small_int(info.get("rank"))
        part.world_size = small_int(info.get("world_size"))
        if isinstance(obj.deviceProperties, list):
            part.gpu_names = [d.get("name") if isinstance(d, dict) and isinstance(d.get("name"), str) else ""
                              for d in obj.deviceProperties]
            part.gpu_capabilities = [capability(d.get("computeMajor"), d.get("computeMinor"))
                                     if isinstance(d, dict) else "" for d in obj.deviceProperties]
        if isinstance(obj.cpus, dict):
            part.cpus = usable_cpus(obj.cpus.get("usable"), obj.cpus.get("count"))
    events: list[Event] = []
    positions: list[int] = []
    problems = part.problems
    for i, raw in enumerate(raws):
        if not i % 65536 and time.monotonic() > deadline:
            raise TraceError(path, "took too long to read (see PHASEPROF_MAX_READ_SECONDS)")
        try:
            e = EVENT_DECODER.decode(raw)
        except msgspec.ValidationError:
            e = _loose_event(raw, i, problems)
            if e is None:
                continue
        events.append(e)
        positions.append(i)
    return part, events, positions


def _loose_event(raw, index: int, problems: Problems) -> Event | None:
    """The event as far as it can be read; None (and counted) if it cannot be used at all."""
    try:
        loose = _LOOSE_EVENT.decode(raw)
    except msgspec.ValidationError:
        problems.skip(index, "", "is not a JSON object")
        return None
    label = loose.name if isinstance(loose.name, str) else ""
    for key in ("ph", "cat", "name"):
        if not isinstance(getattr(loose, key), str):
            problems.skip(index, label, f"{key} is not a string")
            return None
    for key in ("pid", "tid"):
        value = getattr(loose, key)
        if isinstance(value, bool) or not isinstance(value, int | str):
            problems.skip(index, label, f"{key} is not a number or a string")
            return None
    times = []
    for key in ("ts", "dur"):
        value = getattr(loose, key)
        if value is None:
            times.append(NAN)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            problems.skip(index, label, f"{key} is not a number")
            return None
        else:
            times.append(_float(value))
    args = NO_ARGS
    if len(loose.args):
        try:
            args = ARGS_DECODER.decode(loose.args)
        except msgspec.ValidationError:
            args = _loose_args(loose.args, index, label, problems)
    return Event(ph=loose.ph, cat=loose.cat, name=loose.name, pid=loose.pid, tid=loose.tid, ts=times[0],
                  dur=times[1], args=args)


def _loose_args(raw, index: int, label: str, problems: Problems) -> Args:
    """The args of an event, field by field: a field of the wrong type keeps `Args`'s default, and
    is counted (but for a name, and a number given as null)."""
    try:
        loose = _LOOSE_ARGS.decode(raw)
    except msgspec.ValidationError:
        problems.degrade(index, label, "args is not an object")
        return NO_ARGS
    values = {}
    for f in _ARGS_FIELDS:
        value = getattr(loose, f.name)
        if value is msgspec.UNSET:
            continue
        if f.type is Any:  # taken as it comes, checked where used
            values[f.name] = value
            continue
        if f.type is int:
            value = to_int(value)
        elif f.type is float:
            value = to_float(value) if value is not None else f.default
        elif f.type is str:
            value = value if isinstance(value, str) else f.default
        elif f.type != msgspec.Raw:  # a union of numbers and text (a stream: 7 or "0x0")
            value = value if isinstance(value, int | str) and not isinstance(value, bool) else None
        if value is None:
            said = _SAID.get(f.name, f.encode_name if f.type is float else f.name.replace("_", " "))
            problems.degrade(index, label, f"{said} is not a number")
            continue
        values[f.name] = value
    return Args(**values)


_INT_TEXT = re.compile(r"\s*(?:stream\s*)?([+-]?[0-9]{1,18})\s*|\s*0[xX]([0-9a-fA-F]{1,16})\s*", re.ASCII)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def to_int(value) -> int | None:
    """An integer from what traces write for one: a number, ``"7"``, ``"0x7f00"``, ``"stream 7"``;
    None for anything else or past 64 bits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**63 else None
    if isinstance(value, str):
        m = _INT_TEXT.fullmatch(value)
        if m:
            number = int(m.group(1)) if m.group(1) is not None else int(m.group(2), 16)
            return number if number <= _INT64_MAX else None
    return None


def to_float(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = _float(value)
    return number if math.isfinite(number) else None


def _float(value) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past float range
        return math.inf if value > 0 else -math.inf


def capability(major, minor) -> str:
    """A GPU's compute capability as ``"major.minor"``, "" when the trace does not give it."""
    major, minor = small_int(major), small_int(minor)
    return f"{major}.{minor or 0}" if major is not None and major < 100 and (minor or 0) < 10 else ""


def usable_cpus(usable, count) -> int | None:
    """The CPUs a process may use: its affinity where recorded, else the machine's count."""
    for value in (usable, count):
        number = small_int(value)
        if number:
            return number
    return None


def small_int(value) -> int | None:
    number = to_int(value)
    return number if number is not None and 0 <= number < 1 << 31 else None
