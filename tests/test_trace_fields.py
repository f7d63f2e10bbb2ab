"""The typed pass's structs (`plugin/reading/trace_fields.py`): an event decodes as the struct of
its phase, the fields the reader uses for the phases it reads, nothing for the others."""

from __future__ import annotations

from typing import Union

import msgspec
import pytest

from phaseprof.plugin.reading import trace_fields
from phaseprof.plugin.reading.trace_schema import KNOWN_PHASES, READ_PHASES

EVENT = {"cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 3, "dur": 4,
         "args": {"correlation": 5}}


@pytest.mark.parametrize("ph", sorted(KNOWN_PHASES))
def test_an_event_decodes_as_the_struct_of_its_phase(ph):
    struct = trace_fields._typed_event(ph)
    event = msgspec.json.decode(msgspec.json.encode({"ph": ph, **EVENT}), type=struct)
    assert event.ph == ph
    if ph in READ_PHASES:
        assert (event.cat, event.name, event.pid, event.tid, event.ts, event.dur) == (
            "cpu_op", "aten::mm", 1, 2, 3.0, 4.0)
        assert event.args.correlation == 5
    else:  # nothing decoded: in no group of events
        assert event.cat is None and not hasattr(event, "name") and not hasattr(event, "args")


def test_the_phase_chooses_the_struct_among_all():
    phases = sorted(KNOWN_PHASES)
    union = Union[tuple(trace_fields._typed_event(ph) for ph in phases)]  # noqa: UP007
    decoder = msgspec.json.Decoder(list[union])
    events = decoder.decode(msgspec.json.encode([{"ph": ph, **EVENT} for ph in phases]))
    assert [e.ph for e in events] == phases
    assert [e.cat for e in events] == [("cpu_op" if ph in READ_PHASES else None) for ph in phases]
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(b'[{"ph": "no such phase"}]')
