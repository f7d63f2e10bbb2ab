"""Logdirs on object storage (`plugin/reading/storage.py`): fsspec's in-memory store in-process for
what every store does, the S3 server of `tests.s3` for what only S3's client does (its bounded
options, the listing that leaves the analysis folders apart)."""

from __future__ import annotations

import asyncio
import datetime

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFile

from phaseprof.plugin.reading import storage
from phaseprof.plugin.reading.errors import TraceError

ROOT = "/storage-bucket/logs"
URL = f"memory://{ROOT}"


@pytest.fixture
def memory():
    """fsspec's in-memory store holding a logdir: two runs, an analysis folder, and keys outside
    the logdir or through odd segments, which an object store takes as they are."""
    fs = fsspec.filesystem("memory")
    fs.pipe(
        {
            f"{ROOT}/a/rank0.1.pt.trace.json": b"trace a",
            f"{ROOT}/a/.phaseprof/x.analysis": b"analysis",
            f"{ROOT}/b/events.out.tfevents.1": b"0123456789",
            f"{ROOT}-other/c.json": b"beside the logdir",
        }
    )
    for key in (
        f"{ROOT}/../q/x.json",
        f"{ROOT}//y.json",
        f"{ROOT}/./z.json",
        f"{ROOT}/a/../w.json",
    ):
        fs.store[key] = MemoryFile(fs, key, b"odd")
    yield fs
    for key in [k for k in fs.store if k.startswith("/storage-bucket")]:
        del fs.store[key]
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not d.startswith("/storage-bucket")]


def test_urls_and_local_paths():
    for path in ("s3://b/p", "gs://b", "az://c/p", "memory:///x", "S3://b/p"):
        assert storage.is_remote(path), path
    for path in (
        "/tmp/logs",
        "logs",
        "file:///tmp/logs",
        "local://x",
        "FILE://x",
        "C:\\logs",
        "1x://b",
        "://b",
    ):
        assert not storage.is_remote(path), path
    assert storage.scheme("S3://Bucket/p") == "s3"
    assert storage.normalize("s3://b/p//") == storage.normalize("s3://b/p") == "s3://b/p"
    assert storage.join("s3://b/p/", "run", "x.json") == "s3://b/p/run/x.json"
    assert (
        storage.dirname("s3://b/p/run/") == "s3://b/p"
        and storage.dirname("s3://b/p/x.json") == "s3://b/p"
    )
    assert storage.basename("s3://b/p/run/") == "run"
    assert storage.relpath("s3://b/p/run/x.json", "s3://b/p/") == "run/x.json"
    assert storage.relpath("s3://b/p/", "s3://b/p") == "."
    assert storage.relpath("s3://b/q/x.json", "s3://b/p") == "s3://b/q/x.json"  # not under the root
    assert storage.relpath("s3://b/p-other/x", "s3://b/p") == "s3://b/p-other/x"


def test_a_listing_holds_every_object_under_the_logdir_and_nothing_outside_it(memory):
    entries = storage.listing(URL + "/")
    assert [(e.url, e.size, e.etag) for e in entries] == [
        (f"{URL}/a/.phaseprof/x.analysis", 8, ""),
        (f"{URL}/a/rank0.1.pt.trace.json", 7, ""),
        (f"{URL}/b/events.out.tfevents.1", 10, ""),
    ]
    assert all(e.mtime_ns > 1.7e18 for e in entries)  # from the store's "created"
    memory.pipe(f"{ROOT}/c/new.json", b"n")  # uploaded since: the next listing finds it
    assert f"{URL}/c/new.json" in [e.url for e in storage.listing(URL)]
    # not S3: no folder apart, the same objects
    assert storage.listing_apart(URL, ".phaseprof") == (storage.listing(URL), [])


def test_one_object_its_details_and_bytes(memory):
    trace = f"{URL}/a/rank0.1.pt.trace.json"
    entry = storage.info(trace + "/")
    assert (entry.url, entry.size) == (trace, 7) and entry.mtime_ns > 1.7e18
    assert storage.info(f"{URL}/a") is None and storage.info(f"{URL}/none.json") is None
    assert (
        storage.is_dir(f"{URL}/a")
        and not storage.is_dir(trace)
        and not storage.is_dir(f"{URL}/none")
    )
    assert (
        storage.exists(trace)
        and storage.exists(f"{URL}/a")
        and not storage.exists(f"{URL}/none.json")
    )
    assert storage.read(trace, 7) == b"trace a"
    with pytest.raises(TraceError) as big:
        storage.read(trace, 6)
    assert str(big.value) == (
        f"{trace}: the file is larger than 6 B (set PHASEPROF_MAX_TRACE_BYTES to read it)"
    )
    with pytest.raises(TraceError) as gone:
        storage.read(f"{URL}/a/gone.json", 100)
    assert str(gone.value) == f"{URL}/a/gone.json: no such object (deleted since the listing?)"
    with pytest.raises(TraceError) as no_client:
        storage.read("nosuchstore://b/x.json", 100)
    assert (
        str(no_client.value) == "nosuchstore://b/x.json: no file system is known for nosuchstore://"
    )
    assert storage.read_head(trace, 5) == b"trace" and storage.read_head(f"{URL}/gone", 5) == b""
    assert storage.read_head("nosuchstore://b/x", 5) == b""
    events = f"{URL}/b/events.out.tfevents.1"
    assert storage.read_many([trace, events, f"{URL}/gone.json"], 7) == {
        trace: b"trace a"
    }  # events: 10 B
    assert storage.read_many([trace, events], 10) == {trace: b"trace a", events: b"0123456789"}
    assert storage.read_many(["nosuchstore://b/x"], 10) == {}


def test_local_paths_exist_as_files_do(tmp_path):
    assert storage.exists(str(tmp_path)) and not storage.exists(str(tmp_path / "none"))


def test_a_store_s_modification_time_and_etag_whatever_it_names_them():
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
    ns = 1767323045678901000
    assert storage.mtime_ns({"LastModified": when}) == ns
    assert storage.mtime_ns({"last_modified": when.replace(tzinfo=None)}) == ns  # naive: UTC
    assert storage.mtime_ns({"updated": "2026-01-02T03:04:05.678901Z"}) == ns
    assert storage.mtime_ns({"modified": "2026-01-02T05:04:05.678901+02:00"}) == ns
    assert storage.mtime_ns({"mtime": "not a time", "created": 1767323045.5}) == 1767323045500000000
    assert storage.mtime_ns({"creation_time": 12}) == 12_000_000_000
    assert storage.mtime_ns({"LastModified": None, "mtime": 2}) == 2_000_000_000
    assert storage.mtime_ns({"size": 4}) == 0 and storage.mtime_ns({"mtime": [1]}) == 0
    assert storage.etag({"ETag": '"abc"', "etag": "other"}) == '"abc"'
    assert (
        storage.etag({"etag": "def"}) == "def"
        and storage.etag({"ETag": 7}) == ""
        and storage.etag({}) == ""
    )


def test_why_a_logdir_cannot_be_listed_in_one_line():
    assert (
        storage.cannot_list("s3://b/p", storage.StorageError("s3://b/p: pip install x"))
        == "s3://b/p: pip install x"
    )
    assert storage.cannot_list("s3://b/p", PermissionError("AccessDenied")) == (
        "s3://b/p: the store refused access (AccessDenied): check the credentials "
        "(AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws)"
    )
    assert storage.cannot_list("gs://b/p", PermissionError("403")) == (
        "gs://b/p: the store refused access (403): check the credentials "
        "(GOOGLE_APPLICATION_CREDENTIALS or "
        "gcloud's application default credentials)"
    )
    assert (
        storage.cannot_list("other://b/p", PermissionError("no"))
        == "other://b/p: the store refused access (no)"
    )
    assert storage.cannot_list("s3://logs/p/q", FileNotFoundError("NoSuchBucket")) == (
        "s3://logs/p/q: the store has no bucket 'logs' (NoSuchBucket)"
    )
    assert storage.cannot_list("az://runs/p", FileNotFoundError("gone")) == (
        "az://runs/p: the store has no container 'runs' (gone)"
    )
    assert (
        storage.cannot_list("s3://b/p", TimeoutError("slow")) == "s3://b/p: cannot list it (slow)"
    )


def test_a_scheme_without_its_client_or_unknown_is_one_error_naming_what_to_install(monkeypatch):
    with pytest.raises(
        storage.StorageError, match=r"^nosuch://b: no file system is known for nosuch://$"
    ):
        storage.filesystem("nosuch://b")

    def missing(proto):
        raise ImportError(proto)

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(storage.StorageError) as s3:
        storage.filesystem("s3a://b/p")
    assert (
        str(s3.value)
        == "s3a://b/p: reading s3a:// logdirs needs phaseprof's s3 extra: "
        "pip install 'phaseprof[s3]'"
    )
    with pytest.raises(storage.StorageError) as other:
        storage.filesystem("webdav://b/p")
    assert str(other.value) == (
        "webdav://b/p: reading webdav:// logdirs needs phaseprof's storage extra "
        "(fsspec and the client of that store)"
    )


def test_one_file_system_per_scheme_and_kind_and_the_bounded_one_gives_up_soon(s3, monkeypatch):
    monkeypatch.setattr(storage, "_filesystems", {})  # not this module's copies of earlier tests
    fs = storage.filesystem("s3://b")
    assert storage.filesystem("s3://other/p") is fs
    bounded = storage.filesystem("s3://b", bounded=True)
    assert bounded is not fs and storage.filesystem("s3://c", bounded=True) is bounded
    config = dict(bounded.config_kwargs)
    retries = config.pop("retries")
    assert config == {"connect_timeout": 5, "read_timeout": 10}
    # botocore rewrites the dict in place once a client is made (fsspec keeps the instance across
    # tests): max_attempts N, retries after the first try, becomes total_max_attempts N + 1
    tries = retries.get("total_max_attempts", retries.get("max_attempts", -1) + 1)
    assert (retries["mode"], tries) == ("standard", 3)
    assert (
        bounded.retries == 1 and fs.retries == type(fs).retries > 1
    )  # the reader's tries are s3fs's own
    assert storage.call_limit(bounded) == {"timeout": 30}
    assert storage.call_limit(bounded, 3 << 20) == {"timeout": 33}
    assert (
        storage.call_limit(fsspec.filesystem("memory"), 1 << 30) == {}
    )  # not async: no such keyword
    gcs = storage._bounded("gs")["session_kwargs"]["timeout"]
    assert (gcs.sock_connect, gcs.sock_read) == (5, 10)
    assert storage._bounded("gcs")["session_kwargs"]["timeout"] == gcs
    assert (
        storage._bounded("az")
        == storage._bounded("abfs")
        == {"connection_timeout": 5, "read_timeout": 10}
    )
    assert storage._bounded("memory") == {}


def test_gcs_requests_are_tried_twice_and_a_missing_object_once(monkeypatch):
    import aiohttp
    from gcsfs.retry import HttpError

    pauses = []

    async def pause(seconds):
        pauses.append(seconds)

    monkeypatch.setattr(storage.asyncio, "sleep", pause)
    calls = []

    def request(errors):
        async def raw(self, *args, **kwargs):
            calls.append((self, *args))
            if errors:
                raise errors.pop(0)
            return "answer"

        return storage._gcs_tries(raw)

    busy = HttpError({"code": 503, "message": "busy"})
    client = object()  # the file system the request is bound to, passed on
    assert (
        asyncio.run(request([busy])(client, "GET", "b/x")) == "answer"
        and calls == [(client, "GET", "b/x")] * 2
    )
    assert len(pauses) == 1 and 0.5 <= pauses[0] <= 1.5
    calls.clear()
    with pytest.raises(HttpError):
        asyncio.run(request([busy, HttpError({"code": 503, "message": "busy"}), busy])(None))
    assert len(calls) == 2  # TRIES in all
    for missing in (
        HttpError({"code": 404, "message": "no such object"}),
        aiohttp.ClientResponseError(None, (), status=404),
    ):
        calls.clear()
        with pytest.raises(type(missing)):
            asyncio.run(request([missing, busy])(None))
        assert len(calls) == 1, missing
    calls.clear()
    with pytest.raises(ValueError):  # not a transient error: once
        asyncio.run(request([ValueError("bad"), busy])(None))
    assert len(calls) == 1


def test_s3_lists_the_analysis_folders_apart_and_nothing_outside_the_logdir(s3, bucket):
    for key in (
        "p/r/t.json",
        "p/r/.phaseprof/t.json.analysis",
        "p/.phaseprof/u.analysis",
        "p/u.json",
        "p/x.phaseprof/v.json",
        "p/x.phaseprof/.phaseprof/v.analysis",
        "p//odd.json",
        "p-other/w.json",
    ):
        s3.put(bucket, key, b"x" * len(key))
    root = f"s3://{bucket}/p"
    objects, apart = storage.listing_apart(root + "/", ".phaseprof")
    assert [(e.url.removeprefix(root), e.size) for e in objects] == [
        ("/r/t.json", 10),
        ("/u.json", 8),
        ("/x.phaseprof/v.json", 20),
    ]  # each its key's length
    assert all(e.etag.startswith('"') and e.mtime_ns > 1.7e18 for e in objects)
    assert apart == [f"{root}/.phaseprof", f"{root}/r/.phaseprof", f"{root}/x.phaseprof/.phaseprof"]
    assert [e.url.removeprefix(root) for e in storage.listing(root)] == [
        "/.phaseprof/u.analysis",
        "/r/.phaseprof/t.json.analysis",
        "/r/t.json",
        "/u.json",
        "/x.phaseprof/.phaseprof/v.analysis",
        "/x.phaseprof/v.json",
    ]
    assert storage.listing_apart(f"s3://{bucket}/none", ".phaseprof") == ([], [])
    with pytest.raises(FileNotFoundError):
        storage.listing_apart("s3://no-such-bucket-here/p", ".phaseprof")


def test_an_object_that_grew_since_the_store_gave_its_size_is_refused_when_read(
    memory, monkeypatch
):
    fs = storage.filesystem(URL)
    info = fs.info
    monkeypatch.setattr(
        fs, "info", lambda path: {**info(path), "size": 1}
    )  # the size before it grew
    trace = f"{URL}/a/rank0.1.pt.trace.json"
    with pytest.raises(TraceError) as grown:
        storage.read(trace, 6)
    assert (
        str(grown.value)
        == f"{trace}: the file is larger than 6 B (set PHASEPROF_MAX_TRACE_BYTES to read it)"
    )


def test_a_store_that_fails_to_say_whether_a_path_exists_says_it_does_not(memory, monkeypatch):
    def fails(path):
        raise OSError("the store did not answer")

    monkeypatch.setattr(storage.filesystem(URL), "exists", fails)
    assert not storage.exists(f"{URL}/a")


def test_the_bounded_azure_client_tries_a_request_twice_a_second_apart(monkeypatch):
    """adlfs passes no retry options: the policy of its client is set in place (no request
    is made)."""
    from adlfs import AzureBlobFileSystem

    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
        ),
    )
    for key in (("az", True), ("az", False)):  # this test's clients, not the session's
        monkeypatch.delitem(storage._filesystems, key, raising=False)
    try:
        bounded, plain = (
            storage.filesystem("az://c/p", bounded=True),
            storage.filesystem("az://c/p"),
        )
        policy = bounded.service_client._config.retry_policy
        assert (
            policy.total_retries,
            policy.connect_retries,
            policy.read_retries,
            policy.status_retries,
        ) == (1, 1, 1, 1)
        assert (policy.initial_backoff, policy.increment_base, policy.random_jitter_range) == (
            1,
            0,
            0.5,
        )
        assert (
            plain.service_client._config.retry_policy.total_retries > 1
        )  # the reader's: the client's own
    finally:
        for key in (("az", True), ("az", False)):
            storage._filesystems.pop(key, None)
        AzureBlobFileSystem.clear_instance_cache()
