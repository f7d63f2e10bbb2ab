"""Logdirs on object storage (``s3://``, ``gs://``, ``az://``, any URL fsspec knows), read through fsspec.

Local paths never come here: the readers keep their own file-system code for them (non-blocking
opens, memory maps, symbolic-link checks). A URL is read through fsspec and the store's own client
(s3fs, gcsfs, adlfs: the extras ``phaseprof[s3]``, ``[gcs]``, ``[azure]``), with credentials and
endpoint from the usual places (``AWS_*`` environment variables and ``~/.aws``, Google's application
default credentials, ``AZURE_STORAGE_*``); phaseprof passes none and logs none.

A listing is one recursive, paginated listing of the logdir's prefix, fresh at each scan (fsspec's
listing cache is dropped first), so a span uploaded since the last scan is found on the next one; on
S3, TensorBoard's scans leave the analysis folders out of it (`listing_apart`).
Nothing outside the logdir is read: an object whose key does not lie under the logdir's prefix, or
whose key holds empty, ``.`` or ``..`` segments (an object store takes any key; a path made from
them could name something else), is left out of the listing, and only listed objects are read.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import threading
import types

import msgspec

from .errors import TraceError

#: URL scheme -> the extra that installs its client.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "adl": "azure"}


class StorageError(Exception):
    """A logdir URL that cannot be read at all (its client is not installed, the URL is malformed)."""


class Entry(msgspec.Struct, frozen=True):
    """One object under a logdir: its URL, size and modification time, and its ETag (what the store
    says of its content: another content, another ETag; "" where the store says nothing)."""

    url: str
    size: int
    mtime_ns: int
    etag: str = ""


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL of a store (``s3://…``), not a local path (``file://`` is local)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() not in ("file", "local")


def scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def normalize(url: str) -> str:
    """``url`` without trailing slashes (``s3://bucket/p/`` and ``s3://bucket/p`` are one logdir)."""
    head, _, rest = url.partition("://")
    return f"{head}://{rest.rstrip('/')}"


_filesystems: dict[tuple[str, bool], object] = {}
_lock = threading.Lock()

#: A bounded client's limits per request: seconds to connect, seconds to wait for each read of the
#: answer, and tries in all; a store that accepts connections and never answers then fails a request
#: after at most TRIES * (CONNECT_S + READ_S) seconds, instead of the clients' minutes. Some waits
#: escape the clients' timeouts (s3fs waits for a PUT's "100 Continue" with none), so each call of
#: a bounded writer also has a total limit (`call_limit`).
CONNECT_S, READ_S, TRIES = 5, 10, 2
REQUEST_S = TRIES * (CONNECT_S + READ_S)
#: The slowest upload counted on, in bytes per second: a call sending more gets longer.
SLOWEST_BPS = 1 << 20


def call_limit(fs, size: int = 0) -> dict:
    """The keyword that bounds one call of ``fs`` sending ``size`` bytes: fsspec's ``timeout`` of an
    async file system's calls (the call is cancelled then); nothing for another kind of file
    system."""
    if not getattr(fs, "async_impl", False):
        return {}
    return {"timeout": REQUEST_S + size / SLOWEST_BPS}


def _bounded(proto: str) -> dict:
    """The options that bound every request of ``proto``'s client (those its client knows)."""
    if proto in ("s3", "s3a"):  # botocore's tries (s3fs's own loop is made once: `filesystem`)
        return {"config_kwargs": {"connect_timeout": CONNECT_S, "read_timeout": READ_S,
                                  "retries": {"max_attempts": TRIES, "mode": "standard"}}}
    if proto in ("gs", "gcs"):  # gcsfs passes these to its aiohttp session
        import aiohttp

        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_S, sock_read=READ_S)
        return {"session_kwargs": {"timeout": timeout}}
    if proto in ("az", "abfs", "abfss"):
        return {"connection_timeout": CONNECT_S, "read_timeout": READ_S}
    return {}


#: Extra -> where its client finds credentials (what to check when the store refuses them).
CREDENTIALS = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws",
               "gcs": "GOOGLE_APPLICATION_CREDENTIALS or gcloud's application default credentials",
               "azure": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and a key or token"}


def cannot_list(url: str, e: Exception) -> str:
    """One line saying why the logdir ``url`` cannot be listed, from what listing it raised: the
    extra to install, the credentials to check, the bucket that is not there."""
    if isinstance(e, StorageError):
        return str(e)
    extra = EXTRAS.get(scheme(url))
    if isinstance(e, PermissionError):
        where = f": check the credentials ({CREDENTIALS[extra]})" if extra else ""
        return f"{url}: the store refused access ({e}){where}"
    if isinstance(e, FileNotFoundError):
        kind = "container" if extra == "azure" else "bucket"
        return f"{url}: the store has no {kind} {_key(url).partition('/')[0]!r} ({e})"
    return f"{url}: cannot list it ({e})"


def filesystem(url: str, *, bounded: bool = False):
    """The fsspec file system of ``url``'s scheme (one per process and kind); `StorageError` naming
    the extra to install when its client is missing. ``bounded``: every request has a connect and a
    read timeout and few tries (`REQUEST_S`), for a writer that must end in time (`upload`)."""
    proto = scheme(url)
    with _lock:
        fs = _filesystems.get((proto, bounded))
        if fs is not None:
            return fs
        extra = EXTRAS.get(proto)
        hint = f": pip install 'phaseprof[{extra}]'" if extra else " (fsspec and the client of that store)"
        try:
            import fsspec
        except ImportError:
            raise StorageError(f"{url}: reading {proto}:// logdirs needs phaseprof's "
                               f"{extra or 'storage'} extra{hint}") from None
        try:
            cls = fsspec.get_filesystem_class(proto)
        except ImportError:
            raise StorageError(f"{url}: reading {proto}:// logdirs needs phaseprof's "
                               f"{extra or 'storage'} extra{hint}") from None
        except ValueError:
            raise StorageError(f"{url}: no file system is known for {proto}://") from None
        fs = _filesystems[(proto, bounded)] = cls(**(_bounded(proto) if bounded else {}))
        if bounded:
            _few_tries(fs)
        return fs


def _gcs_tries(request):
    """gcsfs's request, undecorated, retried as gcsfs does (what it deems transient, never a 404)
    but `TRIES` times in all, and silently: gcsfs logs a traceback to the user's stderr when it
    gives up, and the uploader says why itself."""
    import aiohttp
    from gcsfs.retry import HttpError, is_retriable

    async def tried(self, *args, **kwargs):
        for attempt in range(1, TRIES + 1):
            try:
                return await request(self, *args, **kwargs)
            except Exception as e:
                missing = isinstance(e, aiohttp.ClientResponseError) and e.status == 404
                missing = missing or (isinstance(e, HttpError) and e.code == 404)
                if attempt == TRIES or missing or not is_retriable(e):
                    raise
            await asyncio.sleep(0.5 + random.random())

    return tried


def _few_tries(fs) -> None:
    """Hold ``fs``'s client to `TRIES` tries a request where no option sets them: a store that
    refuses connections then fails a call in about a second, not after the client's backoff (gcsfs:
    6 tries over 16-20 s; Azure's storage client: 4 over 57 s), which the call's total limit
    (`call_limit`) cut at `REQUEST_S` - so an outage is reported, and the pass ended, that much later."""
    if type(fs).__module__.startswith("s3fs") and hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own loop, a class attribute (botocore's tries are `_bounded`'s)
    elif type(fs).__module__.startswith("gcsfs"):
        raw = getattr(type(fs)._request, "__wrapped__", None)  # gcsfs binds its tries to its class
        if raw is not None:
            fs._request = types.MethodType(_gcs_tries(raw), fs)
    elif (policy := getattr(getattr(getattr(fs, "service_client", None), "_config", None),
                            "retry_policy", None)) is not None:
        # adlfs passes no retry options to its client: its policy (one object, in the pipeline
        # of every request) set in place; a retry after about a second, as the others'
        policy.total_retries = policy.connect_retries = policy.read_retries = TRIES - 1
        policy.status_retries = TRIES - 1
        policy.initial_backoff, policy.increment_base, policy.random_jitter_range = 1, 0, 0.5


def _key(url: str) -> str:
    """The path fsspec takes for ``url`` (bucket and key, without the scheme)."""
    return url.partition("://")[2].rstrip("/")


def _url(proto: str, key: str) -> str:
    return f"{proto}://{key}"


def _safe(key: str, root: str) -> bool:
    """Whether ``key`` lies under ``root`` through plain segments only."""
    if not key.startswith(root + "/"):
        return False
    return all(part not in ("", ".", "..") for part in key[len(root) + 1:].split("/"))


def mtime_ns(info: dict) -> int:
    """An object's modification time in ns from fsspec's details of it (each store names it its own way)."""
    for name in ("LastModified", "last_modified", "mtime", "updated", "modified", "created", "creation_time"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.UTC)
            return int(value.timestamp() * 1_000_000) * 1000
        if isinstance(value, (int, float)):
            return int(value * 1e9)
    return 0


def etag(info: dict) -> str:
    """An object's ETag from fsspec's details of it ("" where the store gave none)."""
    value = info.get("ETag") or info.get("etag") or ""
    return value if isinstance(value, str) else ""


def listing(root: str) -> list[Entry]:
    """Every object under the logdir ``root`` (recursively, all pages), read fresh from the store."""
    fs = filesystem(root)
    proto, prefix = scheme(root), _key(root)
    fs.invalidate_cache(prefix)
    found = fs.find(prefix, detail=True, withdirs=False)
    out = []
    for key, info in sorted(found.items()):
        key = key.rstrip("/")
        if info.get("type") == "directory" or not _safe(key, prefix):
            continue
        out.append(_entry(proto, key, info))
    return out


def listing_apart(root: str, folder: str) -> tuple[list[Entry], list[str]]:
    """`listing`, less the objects of every folder named ``folder`` under ``root``: (the objects,
    the URLs of those folders). An analysis folder holds an object per trace; a rescan that lists
    only the traces reads half the bytes, and the folder is listed on its own when a new trace needs
    it.

    S3 only: a listing whose delimiter is ``folder + "/"`` gets each such folder rolled up into one
    prefix (S3 takes any string as a delimiter). A folder merely ending in that name ("x.phaseprof")
    is rolled up too, and listed the same way on its own. Other stores, or a store that refuses the
    delimiter (S3 Express takes only "/"): `listing`, their objects included, no folder apart."""
    fs = filesystem(root)
    proto, prefix = scheme(root), _key(root)
    if proto not in ("s3", "s3a") or not hasattr(fs, "_lsdir"):
        return listing(root), []
    from fsspec.asyn import sync

    objects, apart, todo = [], [], [prefix]
    try:
        while todo:
            key = todo.pop()
            found = sync(fs.loop, fs._lsdir, key, refresh=True, delimiter=folder + "/")
            fs.invalidate_cache(key)  # s3fs keeps it as the folder's listing: it is not
            for info in found:
                name = info["name"].rstrip("/")
                if not _safe(name, prefix):
                    continue
                if info.get("type") != "directory":
                    objects.append(_entry(proto, name, info))
                elif name.rpartition("/")[2] == folder:
                    apart.append(_url(proto, name))
                else:
                    todo.append(name)
    except OSError as e:
        if isinstance(e, (PermissionError, FileNotFoundError)):
            raise
        return listing(root), []  # the delimiter refused: one plain listing
    return sorted(objects, key=lambda e: e.url), sorted(apart)


def _entry(proto: str, key: str, info: dict) -> Entry:
    return Entry(url=_url(proto, key), size=int(info.get("size") or 0), mtime_ns=mtime_ns(info),
                 etag=etag(info))


def info(url: str) -> Entry | None:
    """The object at ``url`` as it is now, or None if there is none (or it is a prefix)."""
    fs = filesystem(url)
    try:
        fs.invalidate_cache(_key(url))
        details = fs.info(_key(url))
    except (FileNotFoundError, OSError, ValueError):
        return None
    if details.get("type") == "directory":
        return None
    return Entry(url=normalize(url), size=int(details.get("size") or 0), mtime_ns=mtime_ns(details))


def is_dir(url: str) -> bool:
    """Whether ``url`` names a prefix holding objects (a logdir), not one object."""
    fs = filesystem(url)
    try:
        return bool(fs.isdir(_key(url)))
    except (OSError, ValueError):
        return False


def exists(path: str) -> bool:
    """Whether ``path`` (a local path or a URL) names something; `StorageError` if its store's client
    is missing."""
    if not is_remote(path):
        return os.path.exists(path)
    url = path
    fs = filesystem(url)
    try:
        return bool(fs.exists(_key(url)))
    except (OSError, ValueError):
        return False


def read(url: str, limit: int) -> bytes:
    """The whole object at ``url`` if it holds at most ``limit`` bytes; `TraceError` otherwise."""
    from .file_bytes import size_text

    try:
        fs = filesystem(url)
    except StorageError as e:
        raise TraceError(url, str(e).removeprefix(f"{url}: ")) from None
    try:
        details = fs.info(_key(url))
        size = int(details.get("size") or 0)
        if size > limit:
            raise TraceError(url, f"the file is larger than {size_text(limit)} "
                                  "(set PHASEPROF_MAX_TRACE_BYTES to read it)")
        data = fs.cat_file(_key(url))
    except FileNotFoundError:
        raise TraceError(url, "no such object (deleted since the listing?)") from None
    except (OSError, ValueError) as e:
        raise TraceError(url, f"cannot read the object ({e})") from None
    if len(data) > limit:
        raise TraceError(url, f"the file is larger than {size_text(limit)} (set PHASEPROF_MAX_TRACE_BYTES to read it)")
    return data


def read_many(urls: list[str], limit: int) -> dict[str, bytes]:
    """The objects at ``urls`` (of one store) that exist and hold at most ``limit`` bytes, fetched
    concurrently; those missing or larger are left out (their readers read them one by one, and say why)."""
    try:
        fs = filesystem(urls[0])
        found = fs.cat([_key(u) for u in urls], on_error="omit", start=0, end=limit + 1)
    except (OSError, ValueError, StorageError):
        return {}
    proto = scheme(urls[0])
    return {_url(proto, k): v for k, v in found.items() if isinstance(v, bytes) and len(v) <= limit}


def read_head(url: str, n: int) -> bytes:
    """The first ``n`` bytes of the object at ``url`` (empty if it cannot be read)."""
    try:
        return filesystem(url).cat_file(_key(url), start=0, end=n)
    except (OSError, ValueError, StorageError):
        return b""


# --- URL paths (always "/"-separated, whatever the local system) ----------------------------------


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def dirname(url: str) -> str:
    head, _, rest = url.partition("://")
    return f"{head}://{rest.rstrip('/').rpartition('/')[0]}"


def basename(url: str) -> str:
    return url.rstrip("/").rpartition("/")[2]


def relpath(url: str, root: str) -> str:
    """``url`` relative to ``root`` ("." for the root itself), "/"-separated."""
    url, root = normalize(url), normalize(root)
    if url == root:
        return "."
    return url[len(root) + 1:] if url.startswith(root + "/") else url
