"""Reading a file's bytes within limits (`plugin/reading/file_bytes.py`): the budgets a user can
set, and the one line saying why a file was refused."""

from __future__ import annotations

import gzip
import json
import os
import time
import tracemalloc

import fsspec
import pytest

from phaseprof.plugin.reading.decode import read_trace
from phaseprof.plugin.reading.file_bytes import Limits, TraceError, inflate, read_regular, size_text
from tests.tracebuilder import op, step


def test_budgets_are_read_from_the_environment_and_nonsense_keeps_the_default(monkeypatch):
    monkeypatch.setenv("PHASEPROF_MAX_TRACE_BYTES", "1000")
    monkeypatch.setenv("PHASEPROF_MAX_INFLATE_RATIO", "7")
    monkeypatch.setenv("PHASEPROF_MAX_READ_SECONDS", "2.5")
    assert Limits.from_env() == Limits(max_bytes=1000, max_ratio=7, max_seconds=2.5)
    monkeypatch.setenv("PHASEPROF_MAX_INFLATE_RATIO", "1")
    monkeypatch.setenv("PHASEPROF_MAX_READ_SECONDS", "0.5")
    assert (Limits.from_env().max_ratio, Limits.from_env().max_seconds) == (1, 0.5)
    for bad in ("0", "-3", "lots", ""):
        for key in (
            "PHASEPROF_MAX_TRACE_BYTES",
            "PHASEPROF_MAX_INFLATE_RATIO",
            "PHASEPROF_MAX_READ_SECONDS",
        ):
            monkeypatch.setenv(key, bad)
        assert Limits.from_env() == Limits()
    for key in (
        "PHASEPROF_MAX_TRACE_BYTES",
        "PHASEPROF_MAX_INFLATE_RATIO",
        "PHASEPROF_MAX_READ_SECONDS",
    ):
        monkeypatch.delenv(key)
    assert Limits.from_env() == Limits() == Limits(4 << 30, 100, 64 << 20, 300.0)


def test_a_gzip_file_may_inflate_to_its_ratio_or_the_floor_within_the_largest_file():
    limits = Limits(max_bytes=10 << 20, max_ratio=10, min_budget=1 << 20)
    assert limits.inflate_budget(1000) == 1 << 20
    assert limits.inflate_budget(200_000) == 2_000_000
    assert limits.inflate_budget(5 << 20) == 10 << 20


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (64 << 20, "64 MiB"),
        (4 << 30, "4 GiB"),
        ((5 << 30) // 4, "1.2 GiB"),
    ],
)
def test_sizes_read_in_binary_units(n, text):
    assert size_text(n) == text


def test_a_small_file_beside_the_traces_is_read_whole_up_to_its_limit(tmp_path):
    path = tmp_path / "entry.json"
    path.write_bytes(b"x" * 100)
    assert read_regular(str(path), 100) == b"x" * 100
    with pytest.raises(TraceError) as caught:
        read_regular(str(path), 99)
    assert (
        caught.value.reason
        == "the file is larger than 99 B (set PHASEPROF_MAX_TRACE_BYTES to read it)"
    )
    path.write_bytes(b"")
    assert read_regular(str(path), 0) == b""


def test_a_file_past_one_read_s_worth_is_read_whole(tmp_path):
    path = tmp_path / "big.json"
    data = os.urandom(1 << 10) * ((17 << 20) >> 10)  # more than one 16 MiB read
    path.write_bytes(data)
    assert read_regular(str(path), len(data)) == data
    with pytest.raises(TraceError, match="larger than"):
        read_regular(str(path), len(data) - 1)


def test_what_is_not_a_regular_file_is_refused_by_name(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases = {
        str(fifo): "not a regular file (a FIFO); only regular files are read",
        str(tmp_path): "not a regular file (a directory); only regular files are read",
        str(tmp_path / "missing.json"): "cannot open the file (No such file or directory)",
    }
    for path, reason in cases.items():
        with pytest.raises(TraceError) as caught:
            read_regular(path, 1 << 20)
        assert (caught.value.path, caught.value.reason) == (path, reason)


def test_a_link_is_followed_unless_the_caller_says_not_to(tmp_path):
    target = tmp_path / "target.json"
    target.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert read_regular(str(link), 10) == b"{}"
    assert read_regular(str(target), 10, follow_links=False) == b"{}"
    with pytest.raises(TraceError) as caught:
        read_regular(str(link), 10, follow_links=False)
    assert caught.value.reason.startswith("cannot open the file (")


def test_gzip_members_inflate_one_after_another():
    data = gzip.compress(b"a" * 3000) + gzip.compress(b"b" * 5)
    assert inflate(data, 3005, "t.gz", time.monotonic() + 60) == bytearray(b"a" * 3000 + b"b" * 5)
    with pytest.raises(TraceError) as caught:
        inflate(data, 3004, "t.gz", time.monotonic() + 60)
    assert (
        caught.value.reason
        == f"inflates past 2.9 KiB, the limit for a {len(data)} B file (a gzip bomb?)"
    )


def test_broken_gzip_says_how():
    data = gzip.compress(os.urandom(5000))
    with pytest.raises(TraceError) as caught:
        inflate(data[: len(data) // 2], 1 << 20, "t.gz", time.monotonic() + 60)
    assert (
        caught.value.reason == "corrupt gzip data (the file ends before the compressed stream does)"
    )
    with pytest.raises(TraceError) as caught:
        inflate(data[:10] + b"\xff" * 50 + data[60:], 1 << 20, "t.gz", time.monotonic() + 60)
    assert caught.value.reason.startswith("corrupt gzip data (")
    with pytest.raises(TraceError) as caught:
        # a second member cut short
        inflate(data + b"\x1f\x8b", 1 << 20, "t.gz", time.monotonic() + 60)
    cut = "corrupt gzip data (the file ends before the compressed stream does)"
    assert caught.value.reason == cut
    with pytest.raises(TraceError) as caught:
        inflate(data, 1 << 20, "t.gz", time.monotonic() - 1)
    assert (caught.value.path, caught.value.reason) == (
        "t.gz", "took too long to decompress (see PHASEPROF_MAX_READ_SECONDS)")


def test_a_gzip_bomb_is_inflated_piece_by_piece_never_whole():
    bomb = gzip.compress(bytes(64 << 20), 1)  # 64 MiB of zeros in a few hundred KiB
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="a gzip bomb"):
            inflate(bomb, 4 << 20, "bomb.gz", time.monotonic() + 600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_a_small_file_in_a_store_is_read_from_it():
    fs = fsspec.filesystem("memory")
    key = "/file-bytes-bucket/logs/entry.json"
    fs.pipe(key, b"entry")
    try:
        assert read_regular(f"memory://{key}", 100) == b"entry"
    finally:
        fs.rm(key)


@pytest.mark.parametrize("gz", [False, True])
def test_a_trace_read_within_its_budgets_whatever_its_form(tmp_path, gz):
    text = b"\xef\xbb\xbf" + json.dumps({"traceEvents": [step(1, 0, 100), op("a", 1, 1)]}).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    trace = read_trace(str(path))  # the byte-order mark blanked
    assert [trace.names[n] for n in trace.host.name] == ["ProfilerStep#1", "a"]
    with pytest.raises(TraceError) as caught:
        read_trace(str(path), limits=Limits(max_bytes=len(text) - 1, min_budget=0))
    assert caught.value.reason == (
        f"inflates past {len(text) - 1} B, the limit for a {path.stat().st_size} B "
        "file (a gzip bomb?)"
        if gz
        else f"the file is larger than {len(text) - 1} B (set PHASEPROF_MAX_TRACE_BYTES to read it)"
    )
    with pytest.raises(TraceError) as caught:
        read_trace(str(tmp_path))
    assert caught.value.reason == "not a regular file (a directory); only regular files are read"
    with pytest.raises(TraceError) as caught:
        read_trace(str(tmp_path / "missing.json"))
    assert caught.value.reason == "cannot open the file (No such file or directory)"
