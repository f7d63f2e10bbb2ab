"""A run written to an object store (``logdir="s3://bucket/prefix"``, ``gs://``, ``az://``: any URL fsspec
knows): every file is written to a local staging folder first, exactly as to a local logdir, and a
thread of its own copies what is finished to the store, off the training loop.

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

Credentials are the store client's own (``AWS_*``, ``~/.aws``, Google's application default
credentials, ``AZURE_STORAGE_*``); nothing here reads, passes or logs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


class Uploader:
    """Mirrors the finished files under ``local`` to the URL ``remote`` from a thread; `close` uploads
    what is left and removes ``root`` (the staging folder) when all of it is in the store."""

    def __init__(self, root: str, local: str, remote: str, faults: Faults, interval_s: float = INTERVAL_S) -> None:
        self.root = root
        self.local = local
        self.remote = storage.normalize(remote)
        self._faults = faults
        self._interval_s = interval_s
        self._fs = storage.filesystem(remote)
        self._sent: dict[str, tuple[int, int]] = {}  # local path -> (size, mtime_ns) uploaded
        self._down: str | None = None  # while the store does not answer: the fault reported
        self._outages: list[str] = []  # faults reported for outages that ended
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one pass at a time
        self._thread = threading.Thread(target=self._run, name="phaseprof-upload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sync()

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
        with self._lock:
            for path in self.pending():
                try:
                    st = os.stat(path)
                    key = storage.join(self.remote, *os.path.relpath(path, self.local).split(os.sep))
                    self._fs.put_file(path, key.partition("://")[2])
                except FileNotFoundError:
                    continue  # replaced meanwhile (a partial export renamed): the next pass sees it
                except Exception as e:  # noqa: BLE001 - the store's client raises its own kinds
                    if self._down is None:
                        self._faults.report(f"could not upload to {self.remote} (files are kept in {self.local} "
                                            "and uploaded once the store answers)", e)
                        self._down = self._faults.lines[-1]
                    return False
                self._sent[path] = (st.st_size, st.st_mtime_ns)
            if self._down is not None:  # back; the line stays until close (one warning for the run)
                self._outages.append(self._down)
                self._down = None
            return True

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Stop the thread, upload what is left (trying until ``wait_s`` has passed), and remove the
        staging folder if all of it is in the store; True if so."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + wait_s
        while not self.sync():
            if time.monotonic() > deadline:
                left = len(self.pending())
                self._faults.report(f"{left} file(s) not uploaded to {self.remote}",
                                    RuntimeError(f"the store did not answer; they are kept in {self.local}"))
                return False
            time.sleep(min(1.0, self._interval_s))
        shutil.rmtree(self.root, ignore_errors=True)
        for line in self._outages:  # every file reached the store in the end: the summary leaves them out
            with contextlib.suppress(ValueError):
                self._faults.lines.remove(line)
        return True

