"""The capture channel of a run whose logdir is in an object store (``s3://…``, ``gs://``, ``az://``):
the same files as on disk (`phaseprof.capture_channel`), as small objects under
``<run URL>/.phaseprof/capture/``, read and written through the store's client.

What a store changes, and what it does not:

- **Cost.** A rank's watcher looks every `POLL_S` seconds (not every 0.5 s as on disk;
  ``PHASEPROF_CAPTURE_POLL_S`` sets another interval: `poll_s`): one LIST of the request objects
  (``request.*``: one page, whatever the number of ranks, on S3 where the listing takes a prefix;
  the whole folder elsewhere) and one PUT of its heartbeat; then one GET per new request and one PUT
  per change of an answer's state. The asker (``phaseprof capture``, the tab, the slowdown trigger)
  lists the folder and GETs each object (concurrently) per look.
- **The lead.** A request is seen up to one look after it is written; each heartbeat says its
  rank's interval (``look_s``), so the asker's lead (`phaseprof.capture_channel.lead`) covers the
  longest of them and `SLACK_S` for the listing's latency (`LEAD_S` with the default interval).
- **Bounds.** Every call goes through the bounded client (`storage.filesystem(bounded=True)`:
  connect and read timeouts, few tries, a total limit per call): a slow or failing store delays the
  watcher's thread, never the training loop. An object is read only if the listing says it holds
  at most `MAX_FILE_BYTES`, and never more than that many bytes plus one; only keys directly under
  the folder whose names the channel's patterns match are read. A store has no links, so there is
  none to refuse; what another writer of the bucket can write, it can write on disk too (see
  docs/security.md).
- Every failure of the client is a `StoreError` (an OSError) saying which call failed and why, in
  one line; a missing folder (no object under it) is an empty one.
"""

from __future__ import annotations

import os

from phaseprof.plugin.reading import storage

from .capture_channel import MAX_FILE_BYTES, MAX_LOOK_S, Unreadable

#: Seconds between two looks of a rank's watcher at a channel in a store, by default
POLL_S = 3.0
#: and the bounds of another interval set by ``PHASEPROF_CAPTURE_POLL_S`` (`poll_s`).
MIN_POLL_S, MAX_POLL_S = 0.2, MAX_LOOK_S
POLL_ENV = "PHASEPROF_CAPTURE_POLL_S"
#: The asker's lead beyond the ranks' longest look: the listing's and the upload's latency.
SLACK_S = 1.0
#: The asker's lead for ranks that look every `POLL_S`.
LEAD_S = POLL_S + SLACK_S


def poll_s() -> float:
    """This process's interval between two looks at a channel in a store:
    ``PHASEPROF_CAPTURE_POLL_S`` seconds if it is a number within `MIN_POLL_S`..`MAX_POLL_S` (a
    bucket billed per request may want fewer looks, a test a quicker answer), else `POLL_S`. Each
    heartbeat says it, so the asker needs no setting of its own."""
    try:
        chosen = float(os.environ.get(POLL_ENV, POLL_S))
    except ValueError:
        return POLL_S
    return chosen if MIN_POLL_S <= chosen <= MAX_POLL_S else POLL_S


class StoreError(OSError):
    """A call to the store failed; the message says which and why, in one line. ``cause`` is the
    client's error (FileNotFoundError: the bucket does not exist; PermissionError: denied)."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


def _one_line(error: BaseException) -> str:
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class StoreFolder:
    """``<run URL>/.phaseprof/capture/`` in a store: `names`, `read`, `read_many`, `write`, as
    `phaseprof.capture_channel.DiskFolder` has them."""

    def __init__(self, run_url: str, capture_dir: str) -> None:
        self.url = storage.join(storage.normalize(run_url), capture_dir)
        try:
            self._fs = storage.filesystem(run_url, bounded=True)
        except storage.StorageError as e:  # its client is not installed: the message names the extra
            raise StoreError(str(e), e) from None
        self._key = self.url.partition("://")[2]
        self._sizes: dict[str, int] = {}  # name -> size, from the last listing

    def where(self, name: str) -> str:
        return storage.join(self.url, name)

    def names(self, prefix: str = "") -> list[str]:
        """The names of the objects directly in the folder (those starting with ``prefix``): one
        listing."""
        fs, limit = self._fs, storage.call_limit(self._fs)
        try:
            fs.invalidate_cache(self._key)
            if prefix and "s3" in _protocols(fs):  # S3 filters by prefix itself: one page
                found = fs.find(self._key, maxdepth=1, prefix=prefix, detail=True, **limit)
            else:
                found = {o["name"]: o for o in fs.ls(self._key, detail=True, **limit)}
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001 - each client raises its own kinds
            raise StoreError(f"{self.url}: cannot list it: {_one_line(e)}", e) from None
        self._sizes = {}
        for key, info in found.items():
            parent, _, name = key.rstrip("/").rpartition("/")
            if parent == self._key and info.get("type") != "directory" and name.startswith(prefix):
                self._sizes[name] = int(info.get("size") or 0)
        return sorted(self._sizes)

    def read(self, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
        """The object ``name`` (listed by `names`) if it holds at most ``limit`` bytes; else
        `Unreadable`; `StoreError` if the store fails."""
        self._check_size(name, limit)
        try:
            data = self._fs.cat_file(f"{self._key}/{name}", start=0, end=limit + 1,
                                     **storage.call_limit(self._fs))
        except FileNotFoundError:
            raise Unreadable("deleted since it was listed") from None
        except Exception as e:  # noqa: BLE001
            raise StoreError(f"{self.where(name)}: cannot read it: {_one_line(e)}", e) from None
        if len(data) > limit:
            raise Unreadable(f"more than {limit} bytes")
        return data

    def read_many(self, names: list[str], limit: int = MAX_FILE_BYTES) -> dict[str, bytes | Unreadable]:
        """Each object of ``names`` (listed by `names`): its bytes or why it is not read, fetched
        concurrently; `StoreError` if the store fails."""
        out: dict[str, bytes | Unreadable] = {}
        wanted = []
        for name in names:
            try:
                self._check_size(name, limit)
                wanted.append(name)
            except Unreadable as e:
                out[name] = e
        if not wanted:
            return out
        keys = {f"{self._key}/{name}": name for name in wanted}
        try:
            found = self._fs.cat(list(keys), on_error="return", start=0, end=limit + 1,
                                 **storage.call_limit(self._fs))
        except Exception as e:  # noqa: BLE001
            raise StoreError(f"{self.url}: cannot read it: {_one_line(e)}", e) from None
        for key, data in found.items():
            name = keys.get(key.rstrip("/"))
            if name is None:
                continue
            if isinstance(data, FileNotFoundError):
                out[name] = Unreadable("deleted since it was listed")
            elif isinstance(data, BaseException):
                raise StoreError(f"{self.where(name)}: cannot read it: {_one_line(data)}", data)
            else:
                out[name] = data if len(data) <= limit else Unreadable(f"more than {limit} bytes")
        return out

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` as the object ``name`` (a PUT is whole or nothing: no reader sees half)."""
        try:
            self._fs.pipe_file(f"{self._key}/{name}", data, **storage.call_limit(self._fs, len(data)))
        except Exception as e:  # noqa: BLE001
            raise StoreError(f"{self.where(name)}: cannot write it: {_one_line(e)}", e) from None

    def _check_size(self, name: str, limit: int) -> None:
        size = self._sizes.get(name)
        if size is not None and size > limit:
            raise Unreadable(f"{size} bytes, more than {limit}")


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
