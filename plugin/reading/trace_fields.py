"""The fields of a trace file that are decoded, as typed msgspec structs.

msgspec decodes only what is declared here and skips everything else at C speed. Sentinels stand
for "not given" (instead of None) so that whole columns convert to numpy arrays in one call. Fields
whose type differs between the schemas in the wild are unions (`trace_schema`).

The typed pass decodes each event as the struct of its phase ``ph`` (a tagged union, one per phase of
the Chrome trace format): the phases the reader uses (`trace_schema.READ_PHASES`) decode the fields
below, the others (flow arrows, begin/end pairs, counters: a third of a CUDA trace's events) decode
none, which makes the typed pass and freeing its events about a fifth cheaper. An event of an unknown
phase, or without one, fails the typed pass, and the file is read event by event (`lenient`) into
plain `Event`s, as any other wrong value does.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import field

from phaseprof.contract import CPUS_KEY

from .trace_schema import KNOWN_PHASES, READ_PHASES

NAN = float("nan")


class Args(msgspec.Struct, gc=False, frozen=True):
    # Sentinels instead of None so whole columns convert to numpy arrays in one call.
    correlation: int = -1
    input_dims: msgspec.Raw = field(default=msgspec.Raw(b""), name="Input Dims")
    total_allocated: float = field(default=-1.0, name="Total Allocated")
    total_reserved: float = field(default=-1.0, name="Total Reserved")
    nbytes: float = field(default=NAN, name="Bytes")
    device_type: int = field(default=0, name="Device Type")
    device_id: int = field(default=-1, name="Device Id")
    stream: int | str = -1  # ROCm writes a string ("0x0")
    # a kernel's launch and what the CUDA occupancy calculator made of it (Kineto writes them)
    blocks_per_sm: float = field(default=NAN, name="blocks per SM")
    occupancy: float = field(default=NAN, name="est. achieved occupancy %")
    registers: int = field(default=-1, name="registers per thread")
    shared_memory: int = field(default=-1, name="shared memory")
    grid: msgspec.Raw = field(default=msgspec.Raw(b""), name="grid")  # [x, y, z]: parsed once per distinct value
    block: msgspec.Raw = field(default=msgspec.Raw(b""), name="block")
    name: str = ""  # metadata events: process / thread names
    # a collective as ``record_param_comms`` records it (Any: read leniently where used, never
    # sending a file down the event-by-event path for an odd value)
    collective: Any = field(default=None, name="Collective name")
    dtype: Any = None
    in_nelems: Any = field(default=None, name="In msg nelems")
    out_nelems: Any = field(default=None, name="Out msg nelems")
    group_size: Any = field(default=None, name="Group size")
    group_name: Any = field(default=None, name="Process Group Name")
    group_id: Any = field(default=None, name="Process Group ID")
    seq: Any = field(default=None, name="Seq")
    addr: Any = field(default=None, name="Addr")  # a [memory] event's address
    #: an op's autograd sequence number: a backward op carries its forward op's (the module view's link)
    sequence: int = field(default=-1, name="Sequence number")


NO_ARGS = Args()


class _Fields(msgspec.Struct, gc=False):
    """What the reader decodes of an event, its phase ``ph`` aside."""

    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = NAN
    dur: float = NAN
    args: Args = NO_ARGS


class Event(_Fields, gc=False):
    """An event as the event-by-event pass (`lenient`) makes it."""

    ph: str = ""


class _Read(_Fields, gc=False, tag_field="ph"):
    """An event of a phase the reader uses, in the typed pass: `Event`'s fields, ``ph`` from the tag."""


class _Unread(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of a phase the reader does not use, in the typed pass: nothing decoded (no category:
    it is in no group of events)."""


def _typed_event(ph: str) -> type:
    base = _Read if ph in READ_PHASES else _Unread
    namespace = {"ph": ph} if base is _Read else {"ph": ph, "cat": None}
    return msgspec.defstruct(f"Event_{ph or 'unnamed'}", [], bases=(base,), tag=ph, gc=False, namespace=namespace)


#: An event of the typed pass: one struct per phase of the Chrome trace format, chosen by ``ph``.
TypedEvent = Union[tuple(_typed_event(ph) for ph in sorted(KNOWN_PHASES))]  # noqa: UP007 - built at run time


class DistributedInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None


class DeviceProperties(msgspec.Struct, gc=False):
    name: str = ""
    # Any: a value of an odd type must not send the whole file down the event-by-event path
    computeMajor: Any = None
    computeMinor: Any = None


class TraceObject(msgspec.Struct, gc=False):
    traceEvents: list[TypedEvent] | None = None
    distributedInfo: DistributedInfo | None = None
    deviceProperties: list[DeviceProperties] | None = None
    cpus: Any = field(default=None, name=CPUS_KEY)  # {"count": …, "usable": …}, checked where read


OBJECT_DECODER = msgspec.json.Decoder(TraceObject)
LIST_DECODER = msgspec.json.Decoder(list[TypedEvent])
#: One event at a time (the event-by-event pass).
EVENT_DECODER = msgspec.json.Decoder(Event)
ARGS_DECODER = msgspec.json.Decoder(Args)
