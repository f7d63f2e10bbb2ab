"""Decoding a large file in two processes (`plugin/reading/split.py`): the split holds on a
well-formed file, bare list or object, lands near the middle of the work, and reads what one
process reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phaseprof.plugin.reading import split
from phaseprof.plugin.reading.decode import TraceError, read_trace
from tests.test_reading import _rows
from tests.tracebuilder import op, step


@pytest.fixture
def halves(monkeypatch):
    """Every file split in two; the parts each split handed back (None: it gave up)."""
    handed = []
    real = split.decode_in_two

    def spy(*args):
        parts = real(*args)
        handed.append(parts)
        return parts

    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "fork_is_safe", lambda: True)
    monkeypatch.setattr(split, "decode_in_two", spy)
    return handed


def _events(n: int = 400) -> list[dict]:
    return [step(1, 0, 1e6)] + [
        op(f"aten::op{i % 50}", 10 + i, 1, **({"Sequence number": i} if i % 3 else {}))
        for i in range(n)
    ]


@pytest.mark.parametrize("bare_list", [False, True])
def test_a_well_formed_file_is_decoded_in_two_halves_that_make_the_whole(
    tmp_path, halves, bare_list
):
    events = _events()
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(events if bare_list else {"schemaVersion": 1, "traceEvents": events})
    )
    whole = read_trace(str(path), parallel=False)
    two = read_trace(str(path))
    (parts,) = halves
    assert parts is not None and len(parts) == 2  # the split held: both halves decoded
    assert all(len(p.host["ts"]) > 100 for p in parts)
    assert sorted(_rows(whole, "host")) == sorted(_rows(two, "host")) and len(two.host) == 401
    assert path.read_text() == json.dumps(
        events if bare_list else {"schemaVersion": 1, "traceEvents": events}
    )


def test_files_are_split_one_after_another(tmp_path, halves):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events()}))
    for _ in range(3):
        assert len(read_trace(str(path)).host) == 401
    assert len(halves) == 3 and None not in halves


def test_the_split_lands_where_the_events_are_halved_not_the_bytes():
    # small events (~100 bytes) fill about half the bytes, ten times fewer large ones (~1 KB)
    # the rest:
    # the middle of the bytes would leave nearly all the events to the first process
    small = [json.dumps(op(f"s{i}", i, 1)) for i in range(12_000)]
    large = [json.dumps(op(f"l{i}", i, 1, junk="x" * 1000)) for i in range(1_200)]
    buf = ('{"traceEvents":[' + ",".join(small + large) + "]}").encode()
    assert len(buf) > 2 << 20
    at = split._halfway(buf, 0)
    share = buf[:at].count(b'"ph"') / buf.count(b'"ph"')
    assert split.FIRST_SHARE - 0.03 < share < split.FIRST_SHARE + 0.03, share


def test_a_file_written_without_spaces_splits_too(tmp_path, halves):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events()}, separators=(",", ":")))
    assert len(read_trace(str(path)).host) == 401
    (parts,) = halves
    assert parts is not None


def test_a_split_given_up_leaves_no_child_behind(tmp_path, halves):
    split._reap(block=True)  # the children of earlier splits
    before = _children()  # the suite's servers, started earlier
    text = json.dumps({"traceEvents": _events()})
    cut = text.index("}, {", len(text) // 4) + 1
    path = tmp_path / "t.json"
    path.write_text(text[:cut] + ", @@" + text[cut:])  # the first half is no JSON: it fails here
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(str(path))
    assert halves == [None]
    # the child was waited for: none is left, not even a zombie
    assert _children() == before


def _children() -> set[str]:
    """This process's children, zombies included (Linux: what /proc lists under each thread)."""
    tasks = f"/proc/{os.getpid()}/task"
    return {pid for t in os.listdir(tasks) for pid in Path(f"{tasks}/{t}/children").read_text().split()}
