"""A run written to an object store (``logdir="s3://bucket/prefix"``, ``gs://``, ``az://``: any URL fsspec
knows): every file is written to a local staging folder first, exactly as to a local logdir, and a
process of its own (``python -m phaseprof.training_hooks.upload``, torch-free) copies what is finished
to the store: the training process pays neither the uploads' CPU nor their network waits.

Staging: ``<temp dir>/phaseprof-staging-<random>/<run>/`` (``$TMPDIR``, or ``PHASEPROF_STAGING`` to
choose the folder it is made in), one per process, so ranks that share a node never share a file; the
files' names already tell the ranks apart (``rank<N>.<host>_<pid>…``), so no two ranks write one
object. The staging folder mirrors the logdir: ``phaseprof upload <staging folder> <logdir URL>``
uploads what a run left there (`phaseprof.cli.upload`).

What is uploaded, once each when finished: traces once in place (never a partial export, ``.part``,
``.tmp``), their analyses (``.phaseprof/*.analysis``); scalars (``events.out.tfevents.*``, which grow
as the run goes) again whenever they have grown, and a last time on close. The first pass is made
as the run starts, with the scalars' first record: a bucket that does not exist or denies writing
is found then (one small write), not at the first trace. A failed upload stays pending and is tried
again at the next pass (every few seconds): the first failure is one warning (`Faults`, training
goes on) saying why (the bucket does not exist, writing is denied, the store does not answer), and
the pending files go up once the store takes them.

The staging folder is removed only once every staged file is confirmed in the store: one listing
of the run's prefix, each object at its file's size. Otherwise it is kept, and the summary names it
with the command that uploads it: nothing is lost. Every call to the store is bounded (connect and
read timeouts, few tries, a total limit: `storage.call_limit`), and the training process stops the
uploader when its time on close is up, so a store that accepts connections and never answers holds
close()'s uploads no longer than `close_wait_s`.

The two processes speak in lines: the uploader writes ``down <kind> <error>`` when an outage
begins (kind: a key of `WHY`), ``up`` when it ends, and ``done`` or ``left <n>`` when it exits; the
training process writes ``close <seconds>`` (upload what is left, trying that long) or just closes
the pipe (it ended without closing: the uploader then does the same on its own, so a crashed run's
files still reach the store). If the process cannot be started, a thread of the training process
does its work.

Credentials are the store client's own (``AWS_*``, ``~/.aws``, Google's application default
credentials, ``AZURE_STORAGE_*``); nothing here reads, passes or logs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

from phaseprof.contract import EVENT_FILE_MARKER
from phaseprof.plugin.reading import storage

from .faults import Faults

#: Seconds between two passes of the uploader while the run goes on.
INTERVAL_S = 2.0
#: How long close() waits for the last uploads at most: then the staging folder is kept
#: (``PHASEPROF_UPLOAD_WAIT_S`` sets another bound: `close_wait_s`).
CLOSE_WAIT_S = 60.0
#: Of that time, what the uploader leaves itself to answer before the training process stops it.
GRACE_S = 5.0
_UNFINISHED = (".part", ".tmp")
#: The store's refusals, by kind, in words.
WHY = {"missing": "the bucket does not exist", "denied": "the store denies writing there",
       "unreachable": "the store does not answer",
       "unfinished": "a file was still being written (a trace's export or compression not done)"}
STAGING_PREFIX = "phaseprof-staging-"


def close_wait_s() -> float:
    """close()'s bound on the last uploads: ``PHASEPROF_UPLOAD_WAIT_S`` seconds if it is a positive
    number, else `CLOSE_WAIT_S` (a job that must end sooner, or one that can wait longer)."""
    try:
        wait_s = float(os.environ.get("PHASEPROF_UPLOAD_WAIT_S", CLOSE_WAIT_S))
    except ValueError:
        return CLOSE_WAIT_S
    return wait_s if 0 < wait_s < float("inf") else CLOSE_WAIT_S


def staging_root() -> str:
    """A new local folder to stage a run written to a store."""
    parent = os.environ.get("PHASEPROF_STAGING") or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)


def refusal(error: BaseException) -> str:
    """The kind of a store client's error (`WHY`): its clients raise FileNotFoundError for a missing
    bucket and PermissionError for a denied request; anything else (timeouts, refused connections,
    5xx) is a store that does not answer."""
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, PermissionError):
        return "denied"
    return "unreachable"


class StoreError(OSError):
    """The store's client failed (its own error type and message, in one line)."""


class Staged(OSError):
    """Files of the run are kept in the staging folder, not in the store."""


def one_line(error: BaseException) -> str:
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class Mirror:
    """Copies the finished files under ``local`` to the URL ``remote``, and removes ``root`` once
    all of them are confirmed there; ``report(line)`` hears of each outage's beginning
    (``down <kind> <error>``) and end (``up``)."""

    def __init__(self, root: str, local: str, remote: str, report) -> None:
        self.root = root
        self.local = local
        self.remote = storage.normalize(remote)
        self._report = report
        self._fs = storage.filesystem(remote, bounded=True)
        self._sent: dict[str, tuple[int, int]] = {}  # local path -> (size, mtime_ns) uploaded
        #: The kind of the last failure while it lasts (`WHY`); None while the store takes files.
        self.refused: str | None = None
        self.error = ""  # that failure, in one line

    def _walk(self) -> tuple[list[str], list[str]]:
        """(finished, unfinished) regular files under ``local``: never a link (it could name
        anything on this machine)."""
        finished, unfinished = [], []
        for directory, _, names in os.walk(self.local):
            for name in sorted(names):
                path = os.path.join(directory, name)
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        continue
                except OSError:
                    continue
                (unfinished if name.endswith(_UNFINISHED) else finished).append(path)
        return finished, unfinished

    def files(self) -> list[str]:
        """The finished files staged now."""
        return self._walk()[0]

    def unfinished(self) -> list[str]:
        """Files still being written (a trace being exported or compressed, an analysis)."""
        return self._walk()[1]

    def pending(self) -> list[str]:
        """Finished files not in the store as they are now."""
        out = []
        for path in self.files():
            try:
                st = os.stat(path)
            except OSError:
                continue
            if self._sent.get(path) != (st.st_size, st.st_mtime_ns):
                out.append(path)
        # analyses after their traces, scalars last: a reader never finds an analysis without its trace
        return sorted(out, key=lambda p: (EVENT_FILE_MARKER in p, p.endswith(".analysis"), p))

    def left(self) -> int:
        """Files not confirmed in the store (unfinished ones included)."""
        return len(self.pending()) + len(self.unfinished())

    def _key(self, path: str) -> str:
        url = storage.join(self.remote, *os.path.relpath(path, self.local).split(os.sep))
        return url.partition("://")[2]

    def _failed(self, error: BaseException) -> None:
        self._refuse(refusal(error), one_line(error))

    def _refuse(self, kind: str, error: str) -> None:
        self.error = error
        if self.refused != kind:  # an outage begins, or turns into another kind
            self.refused = kind
            self._report(f"down {kind} {self.error}")

    def _answered(self) -> None:
        if self.refused is not None:
            self.refused = None
            self._report("up")

    def sync(self, deadline: float | None = None) -> bool:
        """Upload every pending file once; True if none is left. With a ``deadline`` (monotonic
        seconds), no request is begun that its timeouts could carry past it."""
        for path in self.pending():
            try:
                st = os.stat(path)
                limit = storage.call_limit(self._fs, st.st_size)
                if deadline is not None and time.monotonic() + limit.get("timeout", 0) > deadline:
                    return False
                self._fs.put_file(path, self._key(path), **limit)
            except Exception as e:  # noqa: BLE001 - the store's client raises its own kinds
                if not os.path.isfile(path):
                    continue  # replaced meanwhile (a partial export renamed): the next pass sees it
                self._failed(e)  # a missing bucket is a FileNotFoundError too: not this file's
                return False
            self._sent[path] = (st.st_size, st.st_mtime_ns)
        self._answered()
        return True

    def confirm(self, deadline: float | None = None) -> bool:
        """Whether every finished file is in the store at its size, from one listing of the run's
        prefix; those that are not are pending again, those that are count as uploaded."""
        limit = storage.call_limit(self._fs)
        if deadline is not None and time.monotonic() + limit.get("timeout", 0) > deadline:
            return False
        prefix = self.remote.partition("://")[2]
        try:
            self._fs.invalidate_cache(prefix)
            found = self._fs.find(prefix, detail=True, withdirs=False, **limit)
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            return False
        sizes = {key.rstrip("/"): int(info.get("size") or 0) for key, info in found.items()}
        confirmed = True
        for path in self.files():
            try:
                st = os.stat(path)
            except OSError:
                continue
            if sizes.get(self._key(path)) == st.st_size:
                self._sent[path] = (st.st_size, st.st_mtime_ns)
            else:
                self._sent.pop(path, None)
                confirmed = False
        return confirmed

    def finish(self, wait_s: float, interval_s: float) -> bool:
        """Upload what is left, trying until ``wait_s`` has passed, and remove the staging folder
        once all of it is confirmed in the store. True if so. A missing bucket or a denied write
        ends the tries at once: the store said no, and would say it again."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.sync(deadline) and not self.unfinished() and self.confirm(deadline):
                shutil.rmtree(self.root, ignore_errors=True)
                return True
            pause = min(1.0, interval_s)
            if self.refused in ("missing", "denied") or time.monotonic() + pause > deadline:
                unfinished = self.unfinished()
                if self.refused is None and unfinished:
                    self._refuse("unfinished", ", ".join(os.path.basename(p) for p in unfinished))
                return False
            time.sleep(pause)


def _serve(root: str, local: str, remote: str, interval_s: float) -> int:
    """The uploader process: a first pass as soon as the run has written a file, then passes every
    ``interval_s`` until told to close (or the training process is gone), then the last uploads."""
    # Ctrl-C and a scheduler's SIGTERM reach the whole group: the training process decides (its close()
    # says "close"), and if it is gone the pipe closes: either way the last uploads are made, then exit
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)

    def say(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    mirror = Mirror(root, local, remote, say)
    told: list[str] = []
    closed = threading.Event()
    heard = [0.0]  # when: a pass may still be sending then

    def listen() -> None:
        told.extend(sys.stdin.readline().split())  # "close <seconds>", or nothing when the pipe closes
        heard[0] = time.monotonic()
        closed.set()

    threading.Thread(target=listen, name="phaseprof-upload-listen", daemon=True).start()
    # the scalars' first record is written as the run starts: uploading it at once checks the store
    first = time.monotonic() + interval_s
    while not mirror.pending() and time.monotonic() < first and not closed.wait(0.05):
        pass
    if not closed.is_set():
        mirror.sync()
    while not closed.wait(interval_s):
        mirror.sync()
    wait_s = float(told[1]) if len(told) == 2 and told[0] == "close" else close_wait_s()
    if mirror.finish(wait_s - (time.monotonic() - heard[0]), interval_s):
        say("done")
        return 0
    say(f"left {mirror.left()}")
    return 1


class Uploader:
    """The training process's side: starts the uploader process for the run staged under ``local``
    (in ``root``) and reports its outages to ``faults``; `close` has it upload what is left."""

    def __init__(self, root: str, local: str, remote: str, faults: Faults, interval_s: float = INTERVAL_S) -> None:
        self.root = root
        self.local = local
        self.remote = storage.normalize(remote)
        self._faults = faults
        self._interval_s = interval_s
        self._down: str | None = None  # while the store does not take the files: the fault reported
        self._why: str | None = None  # the store's last refusal, in words
        self._outages: list[str] = []  # faults reported for outages that ended
        self._left: int | None = None  # files the uploader could not upload in the end
        self._done = False
        #: After close: True if files of the run are kept in ``root`` (the summary names it).
        self.kept = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mirror: Mirror | None = None
        try:
            self._process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "phaseprof.training_hooks.upload", root, local, self.remote, str(interval_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, close_fds=True)
        except Exception as e:  # noqa: BLE001 - the uploads then run on a thread here: nothing is lost
            self._process = None
            faults.report("could not start the upload process; uploading from a thread of this process", e)
            self._mirror = Mirror(root, local, self.remote, self._heard)
            self._thread = threading.Thread(target=self._uploads_here, name="phaseprof-upload", daemon=True)
        else:
            self._thread = threading.Thread(target=self._listen, name="phaseprof-upload", daemon=True)
        self._thread.start()

    def _heard(self, line: str) -> None:
        """One line from the uploader."""
        what, _, rest = line.strip().partition(" ")
        if what == "down":
            kind, _, error = rest.partition(" ")
            self._why = f"{WHY.get(kind, WHY['unreachable'])} ({error})"
            if self._down is None:
                why = WHY.get(kind, WHY["unreachable"])
                self._down = self._faults.report(
                    f"could not upload to {self.remote} ({why}); the files are kept in {self.root} "
                    "and uploaded once the store takes them", StoreError(error))
        elif what == "up" and self._down is not None:  # back; the line stays until close (one warning)
            self._outages.append(self._down)
            self._down = None
            self._why = None
        elif what == "done":
            self._done = True
        elif what == "left":
            self._left = int(rest) if rest.isdigit() else None

    def _listen(self) -> None:
        for line in self._process.stdout:
            self._heard(line)

    def _uploads_here(self) -> None:
        self._mirror.sync()
        while not self._stop.wait(self._interval_s):
            self._mirror.sync()

    def close(self, wait_s: float | None = None) -> bool:
        """Have what is left uploaded (trying for ``wait_s`` at most: `close_wait_s`), and the staging
        folder removed if all of it is confirmed in the store; True if so. Otherwise the folder is kept,
        and the summary's line says why and where."""
        wait_s = close_wait_s() if wait_s is None else wait_s
        if self._process is not None:
            with contextlib.suppress(OSError, ValueError):
                self._process.stdin.write(f"close {max(0.0, wait_s - GRACE_S)}\n")
                self._process.stdin.close()
            try:
                self._process.wait(wait_s)
            except subprocess.TimeoutExpired:  # a call outlived its limit: what is staged stays
                self._process.kill()
                self._process.wait()
            self._thread.join()
            self._process.stdout.close()
        else:
            self._stop.set()
            self._thread.join()
            if self._mirror.finish(wait_s, self._interval_s):
                self._done = True
            else:
                self._left = self._mirror.left()
        stale = [line for line in (*self._outages, self._down) if line is not None]
        if not self._done:
            self.kept = True
            left = f"{self._left} file(s)" if self._left is not None else "files"
            why = self._why or f"{WHY['unreachable']} (nothing came back in {wait_s:.0f} s)"
            self._faults.report(f"{left} not uploaded to {self.remote}: {why}",
                                Staged(f"they are kept in {self.root}"))
        for line in stale:  # said once: the last line says what became of the files
            self._faults.withdraw(line)
        return self._done


if __name__ == "__main__":
    sys.exit(_serve(*sys.argv[1:4], float(sys.argv[4])))
