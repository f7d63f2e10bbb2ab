"""A run written to an object store (``logdir="s3://bucket/prefix"``, ``gs://``, ``az://``: any URL fsspec
knows): every file is written to a local staging folder first, exactly as to a local logdir, and a
process of its own (``python -m phaseprof.training_hooks.upload``, torch-free) copies what is finished
to the store: the training process pays neither the uploads' CPU nor their network waits.

Staging: ``<temp dir>/phaseprof-staging-<random>/<run>/`` (``$TMPDIR``, or ``PHASEPROF_STAGING`` to
choose the folder it is made in), one per process, so ranks that share a node never share a file; the
files' names already tell the ranks apart (``rank<N>.<host>_<pid>…``), so no two ranks write one
object. Once everything is uploaded, on close, the staging folder is removed.

What is uploaded, once each when finished: traces once in place (never a partial export, ``.part``,
``.tmp``), their analyses (``.phaseprof/*.analysis``); scalars (``events.out.tfevents.*``, which grow
as the run goes) again whenever they have grown, and a last time on close. A failed upload stays
pending and is tried again at the next pass (every few seconds): the first failure of an outage is one
warning (`Faults`, training goes on), and the pending files go up once the store answers again. If the
store still does not answer when the run closes, the staging folder is kept and the summary says
where: nothing is lost.

The two processes speak in lines: the uploader writes ``down <why>`` when an outage begins, ``up`` when
it ends, and ``done`` or ``left <n>`` when it exits; the training process writes ``close <seconds>``
(upload what is left, trying that long) or just closes the pipe (it ended without closing: the
uploader then does the same on its own, so a crashed run's files still reach the store). If the
process cannot be started, a thread of the training process does its work.

Credentials are the store client's own (``AWS_*``, ``~/.aws``, Google's application default
credentials, ``AZURE_STORAGE_*``); nothing here reads, passes or logs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
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
#: How long close() keeps trying to upload what is left before it gives up and keeps the staging folder.
CLOSE_WAIT_S = 60.0
_UNFINISHED = (".part", ".tmp")


def staging_root() -> str:
    """A new local folder to stage a run written to a store."""
    parent = os.environ.get("PHASEPROF_STAGING") or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="phaseprof-staging-", dir=parent)


class StoreUnreachable(OSError):
    """The store's client failed (its own error type and message, in one line)."""


class Mirror:
    """Copies the finished files under ``local`` to the URL ``remote``; ``report(line)`` hears of each
    outage's beginning (``down …``) and end (``up``)."""

    def __init__(self, root: str, local: str, remote: str, report) -> None:
        self.root = root
        self.local = local
        self.remote = storage.normalize(remote)
        self._report = report
        self._fs = storage.filesystem(remote)
        self._sent: dict[str, tuple[int, int]] = {}  # local path -> (size, mtime_ns) uploaded
        self._down = False

    def pending(self) -> list[str]:
        """Finished files not in the store as they are now."""
        out = []
        for directory, _, names in os.walk(self.local):
            for name in sorted(names):
                if name.endswith(_UNFINISHED):
                    continue
                path = os.path.join(directory, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if self._sent.get(path) != (st.st_size, st.st_mtime_ns):
                    out.append(path)
        # analyses after their traces, scalars last: a reader never finds an analysis without its trace
        return sorted(out, key=lambda p: (EVENT_FILE_MARKER in p, p.endswith(".analysis"), p))

    def sync(self) -> bool:
        """Upload every pending file once; True if none is left."""
        for path in self.pending():
            try:
                st = os.stat(path)
                key = storage.join(self.remote, *os.path.relpath(path, self.local).split(os.sep))
                self._fs.put_file(path, key.partition("://")[2])
            except FileNotFoundError:
                continue  # replaced meanwhile (a partial export renamed): the next pass sees it
            except Exception as e:  # noqa: BLE001 - the store's client raises its own kinds
                if not self._down:
                    self._down = True
                    self._report(f"down {type(e).__name__}: {' '.join(str(e).split())}")
                return False
            self._sent[path] = (st.st_size, st.st_mtime_ns)
        if self._down:
            self._down = False
            self._report("up")
        return True

    def finish(self, wait_s: float, interval_s: float) -> bool:
        """Upload what is left, trying until ``wait_s`` has passed; remove the staging folder if all of
        it is in the store. True if so."""
        deadline = time.monotonic() + wait_s
        while not self.sync():
            if time.monotonic() > deadline:
                return False
            time.sleep(min(1.0, interval_s))
        shutil.rmtree(self.root, ignore_errors=True)
        return True


def _serve(root: str, local: str, remote: str, interval_s: float) -> int:
    """The uploader process: passes every ``interval_s`` until told to close (or the training process
    is gone), then the last uploads."""
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

    def listen() -> None:
        told.extend(sys.stdin.readline().split())  # "close <seconds>", or nothing when the pipe closes
        closed.set()

    threading.Thread(target=listen, name="phaseprof-upload-listen", daemon=True).start()
    while not closed.wait(interval_s):
        mirror.sync()
    wait_s = float(told[1]) if len(told) == 2 and told[0] == "close" else CLOSE_WAIT_S
    if mirror.finish(wait_s, interval_s):
        say("done")
        return 0
    say(f"left {len(mirror.pending())}")
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
        self._down: str | None = None  # while the store does not answer: the fault reported
        self._outages: list[str] = []  # faults reported for outages that ended
        self._left: int | None = None  # files the uploader could not upload in the end
        self._done = False
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
        if what == "down" and self._down is None:
            self._faults.report(f"could not upload to {self.remote} (files are kept in {self.local} "
                                "and uploaded once the store answers)", StoreUnreachable(rest))
            self._down = self._faults.lines[-1]
        elif what == "up" and self._down is not None:  # back; the line stays until close (one warning)
            self._outages.append(self._down)
            self._down = None
        elif what == "done":
            self._done = True
        elif what == "left":
            self._left = int(rest) if rest.isdigit() else None

    def _listen(self) -> None:
        for line in self._process.stdout:
            self._heard(line)

    def _uploads_here(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._mirror.sync()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Have what is left uploaded (trying until ``wait_s`` has passed), and the staging folder
        removed if all of it is in the store; True if so."""
        if self._process is not None:
            with contextlib.suppress(OSError, ValueError):
                self._process.stdin.write(f"close {wait_s}\n")
                self._process.stdin.close()
            try:
                self._process.wait(wait_s + 30)
            except subprocess.TimeoutExpired:
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
                self._left = len(self._mirror.pending())
        if not self._done:
            left = f"{self._left} file(s)" if self._left is not None else "files"
            self._faults.report(f"{left} not uploaded to {self.remote}",
                                RuntimeError(f"the store did not answer; they are kept in {self.local}"))
            return False
        for line in self._outages:  # every file reached the store in the end: the summary leaves them out
            with contextlib.suppress(ValueError):
                self._faults.lines.remove(line)
        return True


if __name__ == "__main__":
    sys.exit(_serve(*sys.argv[1:4], float(sys.argv[4])))
