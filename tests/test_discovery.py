"""Finding runs, workers and spans under a logdir on disk (`plugin/reading/discovery.py`)."""

from __future__ import annotations

import gzip
import os

import fsspec
import pytest

from phaseprof.plugin.reading.discovery import discover, display, within

TRACE = b'{"schemaVersion": 1, "traceEvents": []}'


def _tree(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _listing(root) -> dict[str, dict]:
    return {
        r.name: {
            "path": r.path,
            "scalars": r.has_scalars,
            "ranks": r.rank_scalars,
            "files": [(f.run, f.worker, f.name, f.path, f.size) for f in r.files],
        }
        for r in discover(str(root))
    }


def test_runs_workers_and_spans_by_their_names(tmp_path):
    _tree(
        tmp_path,
        {
            "a/w0.100.pt.trace.json": TRACE,
            "a/w0.200.pt.trace.json.gz": gzip.compress(TRACE),
            "a/w1.pt.trace.json": TRACE,
            "a/.pt.trace.json": TRACE,
            "a/.phaseprof/w0.100.pt.trace.json": TRACE,
            "a/sniffed.json": TRACE,
            "a/bare.json": b' [{"ph": "X"}]',
            "a/zipped.json.gz": gzip.compress(TRACE),
            "a/config.json": b'{"lr": 0.1}',
            "a/list.json": b'[{"lr": 0.1}]',
            "a/broken.json.gz": b"\x1f\x8bxx",
            "a/notes.txt": b"x",
            "b/c/events.out.tfevents.1": b"",
            "top.pt.trace.json": TRACE,
        },
    )
    runs = _listing(tmp_path)
    a = str(tmp_path / "a")
    assert runs == {
        ".": {
            "path": str(tmp_path),
            "scalars": False,
            "ranks": {},
            "files": [
                (".", "top", "top.pt.trace.json", str(tmp_path / "top.pt.trace.json"), len(TRACE))
            ],
        },
        "a": {
            "path": a,
            "scalars": False,
            "ranks": {},
            "files": [
                ("a", ".pt.trace.json", ".pt.trace.json", f"{a}/.pt.trace.json", len(TRACE)),
                ("a", "bare", "bare.json", f"{a}/bare.json", 14),
                ("a", "sniffed", "sniffed.json", f"{a}/sniffed.json", len(TRACE)),
                ("a", "w0", "w0.100.pt.trace.json", f"{a}/w0.100.pt.trace.json", len(TRACE)),
                (
                    "a",
                    "w0",
                    "w0.200.pt.trace.json.gz",
                    f"{a}/w0.200.pt.trace.json.gz",
                    len(gzip.compress(TRACE)),
                ),
                ("a", "w1", "w1.pt.trace.json", f"{a}/w1.pt.trace.json", len(TRACE)),
                ("a", "zipped", "zipped.json.gz", f"{a}/zipped.json.gz", len(gzip.compress(TRACE))),
            ],
        },
        "b/c": {"path": str(tmp_path / "b" / "c"), "scalars": True, "ranks": {}, "files": []},
    }


def test_each_rank_s_scalars_are_part_of_their_run(tmp_path):
    _tree(
        tmp_path,
        {
            "job/w.pt.trace.json": TRACE,
            "job/rank0/events.out.tfevents.1": b"",
            "job/rank1/events.out.tfevents.1": b"",
            "rank2/events.out.tfevents.1": b"",
            "other/rank3/events.out.tfevents.1": b"",
            "traced/rank4/w.pt.trace.json": TRACE,
            "traced/rank4/events.out.tfevents.1": b"",
            "ranked/events.out.tfevents.1": b"",
        },
    )
    runs = _listing(tmp_path)
    assert set(runs) == {".", "job", "other", "traced/rank4", "ranked"}
    assert runs["job"]["ranks"] == {
        0: str(tmp_path / "job" / "rank0"),
        1: str(tmp_path / "job" / "rank1"),
    }
    assert runs["."]["ranks"] == {2: str(tmp_path / "rank2")} and runs["."]["path"] == str(tmp_path)
    assert runs["other"] == {
        "path": str(tmp_path / "other"),
        "scalars": False,
        "ranks": {3: str(tmp_path / "other" / "rank3")},
        "files": [],
    }
    assert runs["traced/rank4"]["scalars"] and runs["traced/rank4"]["files"]
    assert runs["ranked"]["scalars"] and runs["ranked"]["ranks"] == {}


def test_one_trace_file_named_is_a_run_of_its_own_whatever_its_name(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(TRACE)
    (run,) = discover(str(path))
    assert (run.name, run.path) == (".", str(tmp_path))
    assert [(f.run, f.worker, f.name, f.path) for f in run.files] == [
        (".", "notes.txt", "notes.txt", str(path))
    ]
    (named,) = (
        discover(str(tmp_path / "x.json"), None) if (tmp_path / "x.json").write_bytes(b"{}") else []
    )
    assert [f.worker for f in named.files] == ["x"]


def test_links_are_read_where_they_lead_only_inside_the_logdir(tmp_path):
    logdir, outside = tmp_path / "logdir", tmp_path / "outside"
    _tree(tmp_path, {"outside/w.pt.trace.json": TRACE, "logdir/run/real.pt.trace.json": TRACE})
    (logdir / "run" / "in.pt.trace.json").symlink_to(logdir / "run" / "real.pt.trace.json")
    (logdir / "run" / "out.pt.trace.json").symlink_to(outside / "w.pt.trace.json")
    (logdir / "run" / "out.json").symlink_to(outside / "w.pt.trace.json")
    runs = _listing(logdir)
    assert [(f[2], f[3]) for f in runs["run"]["files"]] == [
        ("in.pt.trace.json", str(logdir / "run" / "real.pt.trace.json")),
        ("real.pt.trace.json", str(logdir / "run" / "real.pt.trace.json")),
    ]
    assert within(str(logdir), str(logdir)) and within(str(logdir), str(logdir / "run"))
    assert not within(str(logdir), str(outside)) and not within(
        str(logdir), str(tmp_path / "logdir2")
    )


def test_a_fifo_named_like_json_is_not_opened_to_sniff_it(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    os.mkfifo(tmp_path / "pipe.pt.trace.json")
    runs = _listing(tmp_path)
    assert [f[2] for f in runs["."]["files"]] == ["pipe.pt.trace.json"]


def test_a_directory_that_cannot_be_listed_is_named_and_the_rest_found(tmp_path, monkeypatch):
    _tree(tmp_path, {"ok/w.pt.trace.json": TRACE, "locked/w.pt.trace.json": TRACE})
    real_scandir = os.scandir

    def scandir(path="."):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    unreadable: list = []
    runs = discover(str(tmp_path), unreadable)
    assert [r.name for r in runs] == ["ok"]
    assert unreadable == [
        (str(tmp_path / "locked"), "cannot read the directory (Permission denied)")
    ]
    assert [r.name for r in discover(str(tmp_path))] == ["ok"]


def test_names_are_shown_on_one_line_whatever_bytes_they_hold():
    assert display("run-1") == "run-1"
    assert display("café") == "café"
    assert display("a\nb\tc") == "a\\nb\\tc"
    assert display(b"r\xffn".decode("utf-8", "surrogateescape")) == "r\\xffn"
    assert display("é\x07") == "é\\x07"


ROOT = "/discovery-bucket/logs"  # fsspec's in-memory store keys paths from "/"
URL = f"memory://{ROOT}"


@pytest.fixture
def store():
    """fsspec's in-memory store, emptied of this test's logdir after it."""
    fs = fsspec.filesystem("memory")
    yield fs
    for key in [k for k in fs.store if k.startswith("/discovery-bucket")]:
        del fs.store[key]
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not d.startswith("/discovery-bucket")]


def test_a_logdir_in_a_store_is_found_as_on_disk(store):
    store.pipe({f"{ROOT}/a/w0.100.pt.trace.json": TRACE, f"{ROOT}/a/w0.200.pt.trace.json.gz": b"zz",
                f"{ROOT}/a/.phaseprof/w0.100.pt.trace.json.analysis": b"entry",
                f"{ROOT}/a/sniffed.json": TRACE, f"{ROOT}/a/config.json": b'{"lr": 1}',
                f"{ROOT}/.phaseprof/top.analysis": b"entry", f"{ROOT}/top.pt.trace.json": TRACE,
                f"{ROOT}/b/c/events.out.tfevents.1": b"", f"{ROOT}/job/x.pt.trace.json": TRACE,
                f"{ROOT}/job/rank3/events.out.tfevents.1": b"",
                f"{ROOT}/gone/.phaseprof/old.analysis": b"entry"})
    runs = {r.name: r for r in discover(URL)}
    assert set(runs) == {".", "a", "b/c", "job"}
    a = runs["a"]
    assert a.path == f"{URL}/a" and not a.has_scalars
    assert [(f.run, f.worker, f.name, f.path, f.size) for f in a.files] == [
        ("a", "sniffed", "sniffed.json", f"{URL}/a/sniffed.json", len(TRACE)),
        ("a", "w0", "w0.100.pt.trace.json", f"{URL}/a/w0.100.pt.trace.json", len(TRACE)),
        ("a", "w0", "w0.200.pt.trace.json.gz", f"{URL}/a/w0.200.pt.trace.json.gz", 2)]
    assert list(a.stored) == [f"{URL}/a/.phaseprof/w0.100.pt.trace.json.analysis"]
    assert list(runs["."].stored) == [f"{URL}/.phaseprof/top.analysis"]
    assert runs["."].path == URL and [f.name for f in runs["."].files] == ["top.pt.trace.json"]
    assert runs["b/c"].has_scalars and runs["b/c"].path == f"{URL}/b/c"
    assert runs["job"].rank_scalars == {3: f"{URL}/job/rank3"}


def test_one_trace_in_a_store_named_by_its_url(store):
    store.pipe({f"{ROOT}/run/notes.txt": TRACE})
    (run,) = discover(f"{URL}/run/notes.txt")
    assert (run.name, run.path) == (".", f"{URL}/run")
    assert [(f.worker, f.name, f.path) for f in run.files] == [
        ("notes.txt", "notes.txt", f"{URL}/run/notes.txt")]


def test_a_store_that_cannot_be_listed_is_named_or_raised(store, monkeypatch):
    from phaseprof.plugin.reading import storage

    def refuse(*args):
        raise PermissionError("access denied")

    monkeypatch.setattr(storage, "listing_apart", refuse)
    unreadable: list = []
    assert discover(URL, unreadable) == []
    assert unreadable == [(URL, "cannot list it (access denied)")]
    with pytest.raises(PermissionError):
        discover(URL)


def test_a_run_s_analysis_folder_listed_apart_is_kept_to_list_on_its_own(store, monkeypatch):
    from phaseprof.plugin.reading import storage

    store.pipe({f"{ROOT}/a/w.pt.trace.json": TRACE, f"{ROOT}/top.pt.trace.json": TRACE})
    entries = storage.listing(URL)
    # as S3 lists it: each analysis folder rolled up into one prefix (`storage.listing_apart`)
    apart = [f"{URL}/a/.phaseprof", f"{URL}/.phaseprof", f"{URL}/gone/.phaseprof"]
    monkeypatch.setattr(storage, "listing_apart", lambda root, folder: (entries, apart))
    runs = {r.name: r for r in discover(URL)}
    assert {name: r.analyses_apart for name, r in runs.items()} == {
        ".": f"{URL}/.phaseprof", "a": f"{URL}/a/.phaseprof"}


def test_a_json_file_that_cannot_be_read_to_sniff_it_is_no_trace(tmp_path, monkeypatch):
    from phaseprof.plugin.reading import discovery

    _tree(tmp_path, {"run/sniffed.json": TRACE, "run/w.pt.trace.json": TRACE})

    real_open = os.open

    def failing_open(path, flags, *args):  # a disk error on that file alone
        if str(path).endswith("sniffed.json"):
            raise OSError(5, "Input/output error", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(discovery.os, "open", failing_open)
    runs = _listing(tmp_path)
    assert [f[2] for f in runs["run"]["files"]] == ["w.pt.trace.json"]
