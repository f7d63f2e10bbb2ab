"""The uploads of a run written to a store (`training_hooks/upload.py`), in-process: the staging
folder mirrored to fsspec's in-memory store under a scheme of its own, which refuses writes and
listings as a store does (a missing bucket, a denied write, no answer) while the test says so.
tests/test_object_storage_writing.py runs the same against S3, in the uploader's own process."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
import warnings

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from phaseprof.plugin.reading import storage
from phaseprof.training_hooks import upload
from phaseprof.training_hooks.faults import Faults

SCHEME = "uploadtest"
REMOTE = f"{SCHEME}:///bucket/logs/r/"  # a trailing slash: the same logdir


class Store(MemoryFileSystem):
    """fsspec's in-memory store, its own objects apart, that raises `refuse` (while set) on every
    write and listing."""

    protocol = SCHEME
    store: dict = {}
    pseudo_dirs = [""]
    refuse: BaseException | None = None
    puts: list[str] = []
    #: True: the store's client is an async one, whose calls take a total limit (`timeout`)
    async_impl = False
    limits: list[float] = []  # the limit of each call that had one

    def put_file(self, lpath, rpath, *args, **kwargs):
        self._limited(kwargs)
        if Store.refuse is not None:
            raise Store.refuse
        Store.puts.append(rpath)
        return super().put_file(lpath, rpath, *args, **kwargs)

    def find(self, *args, **kwargs):
        self._limited(kwargs)
        if Store.refuse is not None:
            raise Store.refuse
        return super().find(*args, **kwargs)

    def _limited(self, kwargs: dict) -> None:
        if "timeout" in kwargs:
            Store.limits.append(kwargs.pop("timeout"))


@pytest.fixture
def store():
    fsspec.register_implementation(SCHEME, Store, clobber=True)
    Store.store.clear()
    Store.pseudo_dirs[:] = [""]
    Store.refuse, Store.puts[:], Store.async_impl, Store.limits[:] = None, [], False, []
    yield Store
    Store.store.clear()
    Store.refuse, Store.async_impl = None, False
    for key in [k for k in storage._filesystems if k[0] == SCHEME]:
        del storage._filesystems[key]


def keys() -> list[str]:
    return sorted(k.removeprefix("/bucket/logs/r/") for k in Store.store)


def staged(tmp_path, files: dict[str, bytes]) -> tuple[str, str]:
    """A staging folder (root) holding the run folder ``r`` with ``files``."""
    root = tmp_path / "phaseprof-staging-x"
    for name, data in files.items():
        path = root / "r" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "r").mkdir(parents=True, exist_ok=True)
    return str(root), str(root / "r")


RUN = {
    "events.out.tfevents.1.host": b"scalars",
    "w.1.pt.trace.json.gz": b"trace one",
    ".phaseprof/w.1.pt.trace.json.gz.analysis": b"analysis",
    "w.0.pt.trace.json": b"trace zero",
}


def test_finished_files_go_up_traces_then_analyses_then_scalars_and_the_staging_folder_goes(
    store, tmp_path
):
    root, local = staged(tmp_path, {**RUN, "w.2.pt.trace.json.part": b"half", "x.tmp": b"half"})
    os.symlink(
        "/etc/hostname", os.path.join(local, "link.json")
    )  # never a link: it could name anything
    heard = []
    mirror = upload.Mirror(root, local, REMOTE, heard.append)
    assert mirror.remote == f"{SCHEME}:///bucket/logs/r"
    assert [os.path.relpath(p, local) for p in mirror.pending()] == [
        "w.0.pt.trace.json",
        "w.1.pt.trace.json.gz",
        ".phaseprof/w.1.pt.trace.json.gz.analysis",
        "events.out.tfevents.1.host",
    ]
    assert sorted(os.path.basename(p) for p in mirror.unfinished()) == [
        "w.2.pt.trace.json.part",
        "x.tmp",
    ]
    assert mirror.left() == 6
    assert mirror.sync()
    assert [p.removeprefix("/bucket/logs/r/") for p in Store.puts] == [
        "w.0.pt.trace.json",
        "w.1.pt.trace.json.gz",
        ".phaseprof/w.1.pt.trace.json.gz.analysis",
        "events.out.tfevents.1.host",
    ]
    assert Store.store["/bucket/logs/r/w.1.pt.trace.json.gz"].getvalue() == b"trace one"
    assert mirror.pending() == [] and mirror.left() == 2
    assert mirror.sync() and len(Store.puts) == 4  # nothing sent twice
    scalars = os.path.join(local, "events.out.tfevents.1.host")
    with open(scalars, "ab") as fh:
        fh.write(b" and more")  # the scalars grew: sent again
    assert mirror.pending() == [scalars]
    assert not mirror.finish(0.2, 0.01)  # the unfinished export is never sent: the folder stays
    assert (
        heard == ["down unfinished w.2.pt.trace.json.part, x.tmp"]
        and mirror.refused == "unfinished"
    )
    assert (
        Store.store["/bucket/logs/r/events.out.tfevents.1.host"].getvalue() == b"scalars and more"
    )
    os.rename(
        os.path.join(local, "w.2.pt.trace.json.part"), os.path.join(local, "w.2.pt.trace.json")
    )
    os.remove(os.path.join(local, "x.tmp"))
    assert mirror.finish(30, 0.01) and not os.path.exists(root)
    assert keys() == sorted([*RUN, "w.2.pt.trace.json"]) and "link.json" not in keys()
    assert heard == ["down unfinished w.2.pt.trace.json.part, x.tmp", "up"]


def test_a_listing_confirms_each_file_at_its_size_and_what_is_not_there_goes_up_again(
    store, tmp_path
):
    root, local = staged(tmp_path, RUN)
    mirror = upload.Mirror(root, local, REMOTE, [].append)
    assert mirror.confirm() is False and len(mirror.pending()) == 4  # nothing there yet
    assert mirror.sync() and mirror.confirm()
    Store().rm_file("/bucket/logs/r/w.0.pt.trace.json")  # lost by the store
    Store().pipe_file("/bucket/logs/r/w.1.pt.trace.json.gz", b"trace")  # another size
    assert not mirror.confirm()
    assert sorted(os.path.basename(p) for p in mirror.pending()) == [
        "w.0.pt.trace.json",
        "w.1.pt.trace.json.gz",
    ]
    assert mirror.sync() and mirror.confirm() and mirror.pending() == []
    open(
        os.path.join(local, "empty.json"), "wb"
    ).close()  # an object of no bytes is one at its size
    assert mirror.sync() and mirror.confirm() and mirror.pending() == []
    other = upload.Mirror(
        root, local, REMOTE, [].append
    )  # a new uploader: the listing says all is there
    assert other.pending() != [] and other.confirm() and other.pending() == []
    assert other.finish(30, 0.01) and not os.path.exists(root) and len(Store.puts) == 7


def test_an_outage_is_said_once_as_it_begins_or_changes_kind_and_once_as_it_ends(store, tmp_path):
    root, local = staged(tmp_path, RUN)
    heard = []
    mirror = upload.Mirror(root, local, REMOTE, heard.append)
    Store.refuse = PermissionError("Access  Denied\nby policy")
    assert not mirror.sync() and not mirror.sync()
    assert heard == ["down denied PermissionError: Access Denied by policy"]
    assert (mirror.refused, mirror.error) == ("denied", "PermissionError: Access Denied by policy")
    Store.refuse = FileNotFoundError("NoSuchBucket")
    assert not mirror.confirm()
    assert heard[1:] == ["down missing FileNotFoundError: NoSuchBucket"]
    assert not mirror.finish(30, 30)  # the store said no: no waiting for it to say it again
    Store.refuse = TimeoutError()
    assert not mirror.sync() and heard[2:] == ["down unreachable TimeoutError"]
    Store.refuse = None
    assert mirror.sync() and heard[3:] == ["up"] and mirror.refused is None
    assert mirror.sync() and heard[4:] == []
    assert keys() == sorted(RUN)


def test_no_call_is_begun_past_the_deadline(store, tmp_path):
    root, local = staged(tmp_path, RUN)
    mirror = upload.Mirror(root, local, REMOTE, [].append)
    past = time.monotonic() - 1
    assert not mirror.sync(past) and not mirror.confirm(past) and Store.puts == []
    assert mirror.sync(time.monotonic() + 600) and mirror.confirm(time.monotonic() + 600)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FileNotFoundError("x"), "missing"),
        (PermissionError("x"), "denied"),
        (ConnectionRefusedError("x"), "unreachable"),
        (OSError(), "unreachable"),
    ],
)
def test_a_client_s_error_is_a_kind_of_refusal(error, kind):
    assert upload.refusal(error) == kind


def test_close_waits_as_the_environment_says_when_it_says_a_positive_number(monkeypatch):
    for value, wait_s in (
        ("5", 5.0),
        ("0.5", 0.5),
        ("0", 60.0),
        ("-3", 60.0),
        ("inf", 60.0),
        ("nan", 60.0),
        ("soon", 60.0),
    ):
        monkeypatch.setenv("PHASEPROF_UPLOAD_WAIT_S", value)
        assert upload.close_wait_s() == wait_s, value
    monkeypatch.delenv("PHASEPROF_UPLOAD_WAIT_S")
    assert upload.close_wait_s() == upload.CLOSE_WAIT_S == 60.0


def test_a_run_is_staged_in_a_new_folder_of_its_own_where_the_user_says(monkeypatch, tmp_path):
    monkeypatch.setenv("PHASEPROF_STAGING", str(tmp_path / "made" / "here"))
    first, second = upload.staging_root(), upload.staging_root()
    assert first != second
    for root in (first, second):
        assert os.path.dirname(root) == str(tmp_path / "made" / "here") and os.path.isdir(root)
        assert os.path.basename(root).startswith("phaseprof-staging-")
    monkeypatch.setenv("PHASEPROF_STAGING", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(upload.tempfile, "tempdir", None)  # read TMPDIR again
    assert os.path.dirname(upload.staging_root()) == str(tmp_path)


def thread_uploader(monkeypatch, root, local, faults, interval_s=0.01) -> upload.Uploader:
    """An Uploader that cannot start its process: its uploads run on a thread here."""
    asked = []

    def no_process(args, **kwargs):
        asked.append(args)
        raise OSError("no more processes")

    monkeypatch.setattr(upload.subprocess, "Popen", no_process)
    with pytest.warns(RuntimeWarning, match="could not start the upload process"):
        uploader = upload.Uploader(root, local, REMOTE, faults, interval_s=interval_s)
    assert asked == [
        [
            sys.executable,
            "-m",
            "phaseprof.training_hooks.upload",
            root,
            local,
            f"{SCHEME}:///bucket/logs/r",
            str(interval_s),
        ]
    ]
    # a daemon: a run that never closes is not kept alive by its uploads
    assert [t.daemon for t in threading.enumerate() if t.name == "phaseprof-upload"] == [True]
    return uploader


def test_a_thread_uploads_when_no_process_can_and_close_removes_the_staging_folder(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, RUN)
    faults = Faults(REMOTE)
    uploader = thread_uploader(monkeypatch, root, local, faults)
    assert uploader.remote == f"{SCHEME}:///bucket/logs/r"
    deadline = time.monotonic() + 15  # a pass every 10 ms: seconds are plenty on a busy machine
    while keys() != sorted(RUN):  # the first passes, before close
        assert time.monotonic() < deadline, keys()
        time.sleep(0.01)
    (tmp_path / "phaseprof-staging-x" / "r" / "w.5.pt.trace.json").write_bytes(b"later")
    while "w.5.pt.trace.json" not in keys():  # a later pass
        assert time.monotonic() < deadline, keys()
        time.sleep(0.01)
    assert uploader.close(wait_s=60) and not uploader.kept and not os.path.exists(root)
    assert faults.summary() == [
        "could not start the upload process; uploading from a thread of this process: "
        "OSError: no more processes"
    ]


def test_files_the_store_never_took_are_kept_and_the_summary_says_why_and_where(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, RUN)
    faults = Faults(REMOTE)
    Store.refuse = PermissionError("AccessDenied")
    uploader = thread_uploader(monkeypatch, root, local, faults)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run's one warning was the thread's
        assert not uploader.close(wait_s=30)
    assert uploader.kept and os.path.isdir(local) and keys() == []
    assert faults.summary() == [
        "could not start the upload process; uploading from a thread of this process: "
        "OSError: no more processes",
        f"4 file(s) not uploaded to {SCHEME}:///bucket/logs/r: the store denies writing there "
        f"(PermissionError: AccessDenied): Staged: they are kept in {root}",
    ]


def test_the_uploader_s_lines_become_one_fault_per_outage_and_the_last_says_what_became_of_them(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, {})
    faults = Faults(REMOTE)
    uploader = thread_uploader(monkeypatch, root, local, faults)
    url = f"{SCHEME}:///bucket/logs/r"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        uploader._heard("down unreachable ConnectTimeoutError: no answer\n")
        uploader._heard(
            "down denied PermissionError: AccessDenied"
        )  # the same outage, another kind
        first = (
            f"could not upload to {url} (the store does not answer); the files are kept in "
            f"{root} and "
            "uploaded once the store takes them: StoreError: ConnectTimeoutError: no answer"
        )
        assert faults.lines[1:] == [first]
        uploader._heard("up")
        uploader._heard("up")  # said once
        uploader._heard(
            "down strange ValueError: odd"
        )  # a kind not known: a store that does not answer
        second = (
            f"could not upload to {url} (the store does not answer); the files are kept in "
            f"{root} and "
            "uploaded once the store takes them: StoreError: ValueError: odd"
        )
        assert faults.lines[1:] == [first, second]
        uploader._heard("left 3")
        uploader._mirror.finish = lambda wait_s, interval_s: False  # the thread's last pass fails
        uploader._mirror.left = lambda: 3
        assert not uploader.close(wait_s=1)
    # the outages' lines are withdrawn: the last one tells the end of them
    assert faults.summary() == [
        faults.lines[0],
        f"3 file(s) not uploaded to {url}: the store does not answer (ValueError: odd): "
        "Staged: they are kept "
        f"in {root}",
    ]


def test_the_uploader_s_done_and_left_lines(store, tmp_path, monkeypatch):
    root, local = staged(tmp_path, {})
    uploader = thread_uploader(monkeypatch, root, local, Faults(REMOTE))
    uploader._heard("left many")
    assert uploader._left is None
    uploader._heard("left 12")
    assert uploader._left == 12
    uploader._heard("done")
    assert uploader._done and uploader.close(wait_s=5) and not uploader.kept


class Pipe:
    """The uploader process's stdin: one line, written when the test says."""

    def __init__(self) -> None:
        self._line, self._ready = "", threading.Event()

    def write(self, line: str) -> None:
        self._line = line
        self._ready.set()

    def readline(self) -> str:
        self._ready.wait(60)
        return self._line


def serve(monkeypatch, root, local, told: str | None):
    """`upload._serve` in a thread of this process (its signals left alone): (the thread, its
    stdin, its stdout, its exit status)."""
    monkeypatch.setattr(upload.signal, "signal", lambda *args: None)
    stdin, stdout, status = Pipe(), io.StringIO(), []
    monkeypatch.setattr(upload.sys, "stdin", stdin)
    monkeypatch.setattr(upload.sys, "stdout", stdout)
    thread = threading.Thread(
        target=lambda: status.append(upload._serve(root, local, REMOTE, 0.01))
    )
    thread.start()
    return thread, stdin, stdout, status


def test_the_uploader_process_uploads_at_once_then_on_close_and_says_done(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, {"events.out.tfevents.1.host": b"first record"})
    thread, stdin, stdout, status = serve(monkeypatch, root, local, None)
    deadline = time.monotonic() + 60
    while keys() != ["events.out.tfevents.1.host"]:  # the first pass: the store checked at once
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (tmp_path / "phaseprof-staging-x" / "r" / "w.1.pt.trace.json").write_bytes(b"trace")
    stdin.write("close 60\n")
    thread.join(60)
    assert status == [0] and stdout.getvalue() == "done\n"
    assert keys() == ["events.out.tfevents.1.host", "w.1.pt.trace.json"] and not os.path.exists(
        root
    )


def test_an_uploader_whose_run_died_uploads_what_is_left_and_says_how_many_it_could_not(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, RUN)
    monkeypatch.setenv("PHASEPROF_UPLOAD_WAIT_S", "0.2")
    Store.refuse = TimeoutError("no answer")
    thread, stdin, stdout, status = serve(monkeypatch, root, local, None)
    stdin.write("")  # the pipe closed without "close": the run ended without close()
    thread.join(60)
    assert (
        status == [1] and stdout.getvalue() == "down unreachable TimeoutError: no answer\nleft 4\n"
    )
    assert os.path.isdir(local)


def test_no_call_is_begun_that_its_limit_could_carry_past_the_deadline(store, tmp_path):
    root, local = staged(tmp_path, {"w.1.pt.trace.json": b"x" * (2 << 20)})
    Store.async_impl = True  # each call then has a total limit: 30 s and a second per MiB sent
    mirror = upload.Mirror(root, local, REMOTE, [].append)
    soon = time.monotonic() + 20
    assert not mirror.sync(soon) and not mirror.confirm(soon) and Store.puts == Store.limits == []
    assert mirror.sync(time.monotonic() + 600) and mirror.confirm(time.monotonic() + 600)
    assert Store.limits == [32.0, 30.0]


def test_a_store_that_never_said_why_is_one_that_did_not_answer(store, tmp_path, monkeypatch):
    root, local = staged(tmp_path, {"events.out.tfevents.1.host": b"first"})
    faults = Faults(REMOTE)
    uploader = thread_uploader(
        monkeypatch, root, local, faults, interval_s=600
    )  # one pass, on start
    deadline = time.monotonic() + 60
    while keys() != ["events.out.tfevents.1.host"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with open(os.path.join(local, "events.out.tfevents.1.host"), "ab") as fh:
        fh.write(b" and more")  # grown since: to be sent again
    assert not uploader.close(wait_s=0)  # no time left for it
    assert faults.summary()[1:] == [
        f"1 file(s) not uploaded to {SCHEME}:///bucket/logs/r: the store does not "
        f"answer (nothing came back in 0 s): Staged: they are kept in {root}"
    ]


class Gone(io.StringIO):
    """The training process's end of the pipe, gone: every write raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def write(self, text):
        raise self.error


@pytest.mark.parametrize(
    "error", [BrokenPipeError(32, "Broken pipe"), ValueError("I/O operation on closed file")]
)
def test_the_uploader_carries_on_when_the_training_process_cannot_hear_it(
    store, tmp_path, monkeypatch, error
):
    root, local = staged(tmp_path, RUN)
    Store.refuse = TimeoutError("no answer")  # an outage to say, which no one hears
    thread, stdin, _, status = serve(monkeypatch, root, local, None)
    monkeypatch.setattr(upload.sys, "stdout", Gone(error))
    Store.refuse = None
    stdin.write("close 60\n")
    thread.join(60)
    assert status == [0] and keys() == sorted(RUN) and not os.path.exists(root)


def test_a_file_gone_between_the_listing_and_its_details_is_passed_over(
    store, tmp_path, monkeypatch
):
    root, local = staged(tmp_path, {"a.json": b"gone", **RUN})
    lstat = os.lstat

    def removed_meanwhile(path, *args, **kwargs):
        if path.endswith("a.json"):
            raise FileNotFoundError(path)
        return lstat(path, *args, **kwargs)

    monkeypatch.setattr(upload.os, "lstat", removed_meanwhile)
    mirror = upload.Mirror(root, local, REMOTE, [].append)
    assert sorted(os.path.relpath(p, local) for p in mirror.files()) == sorted(RUN)


class Child:
    """The uploader process as the training process sees it: its pipes (stdin records what it is
    told, or raises ``error`` as a pipe to a process gone does; stdout gives ``lines``)."""

    def __init__(self, lines: list[str], error: BaseException | None = None) -> None:
        self.told: list[str] = []
        child = self

        class Stdin:
            def write(self, text):
                if error is not None:
                    raise error
                child.told.append(text)

            def close(self):
                pass

        self.stdin, self.stdout = Stdin(), io.StringIO("".join(lines))

    def wait(self, timeout=None):
        return 0


@pytest.mark.parametrize("error", [None, BrokenPipeError(32, "Broken pipe"), ValueError("closed")])
def test_close_tells_the_uploader_process_how_long_it_has_and_hears_it_is_done(
    store, tmp_path, monkeypatch, error
):
    root, local = staged(tmp_path, {})
    child = Child(["done\n"], error)
    monkeypatch.setattr(upload.subprocess, "Popen", lambda *args, **kwargs: child)
    faults = Faults(REMOTE)
    uploader = upload.Uploader(root, local, REMOTE, faults)
    assert uploader.close(wait_s=12) and faults.summary() == []
    assert child.told == ([] if error else [f"close {12 - upload.GRACE_S}\n"])
