"""`phaseprof cache --compress`, which PhaseProfiler runs on each trace it exports, given what a
writer of the logdir can leave at an exported trace's name: a FIFO is refused at once with one line
naming it, and every path reaches the terminal as plain text."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

#: A name that would clear the screen and set the window title if printed raw.
HOSTILE = "w\x1b[2J\x1b]0;pwned\x07"
#: The longest a refusal may take before the test calls it a hang (it takes well under a second).
HANG_S = 120
FIFO_REFUSED = "not a regular file (a FIFO); only a regular file is compressed"


def compress(*paths, extra=()):
    command = [sys.executable, "-m", "phaseprof.cli", "cache", "--compress", *extra]
    command += map(str, paths)
    return subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)


def test_a_fifo_at_an_exported_traces_name_is_refused_at_once_naming_it(tmp_path):
    fifo = tmp_path / "w.1.pt.trace.json.part"
    os.mkfifo(fifo)
    for extra in ((), ("--no-analysis",)):
        out = compress(fifo, extra=extra)  # before, it waited forever for a writer
        assert out.returncode == 1
        assert out.stderr.splitlines() == [f"{fifo}: could not compress: {FIFO_REFUSED}"]
        # nothing made, nothing removed
        assert sorted(p.name for p in tmp_path.iterdir()) == [fifo.name]


def test_every_path_is_printed_as_plain_text(tmp_path):
    missing = tmp_path / f"{HOSTILE}.2.pt.trace.json.part"
    misnamed = tmp_path / f"{HOSTILE}.3.pt.trace.json"
    out = compress(missing, misnamed)
    assert out.returncode == 1
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr, out.stderr
    escaped = str(tmp_path / "w\\x1b[2J\\x1b]0;pwned\\x07")
    assert out.stderr.splitlines() == [
        f"{escaped}.2.pt.trace.json.part: could not compress: No such file or directory",
        f"{escaped}.3.pt.trace.json: could not compress: not an exported trace (its name does not "
        "end with .part)"]


def test_an_exported_trace_is_compressed_into_place_and_analysed(tmp_path, traces):
    (source,) = traces.files("cpu", "base")
    exported = tmp_path / (source.name.removesuffix(".gz") + ".part")
    exported.write_bytes(gzip.decompress(source.read_bytes()))
    out = compress(exported)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert not exported.exists()
    trace = tmp_path / source.name
    assert gzip.decompress(trace.read_bytes()) == gzip.decompress(source.read_bytes())
