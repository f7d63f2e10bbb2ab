"""The capture channel: how a viewer (``phaseprof capture``, the tab's button, the slowdown trigger)
asks a running training job for a trace of its next steps, through files under the run.

Torch-free: the training side (`phaseprof.training_hooks.capture`) and the TensorBoard side (the
CLI, the plugin's ``/capture`` route) both import it. Everything lives in
``<run>/.phaseprof/capture/`` (`phaseprof.contract.CAPTURE_DIR`) — for a run in an object store,
as objects under that prefix (`phaseprof.capture_store`; every function here takes either, through
`open_folder`)::

    rank<R>.json                 each rank's heartbeat: its current step, its pace, whether it ended
    request.<id>.json            a request: trace N steps from step S (on all ranks, or some)
    answer.<id>.rank<R>.json     rank R's answer: accepted, tracing, written (which steps, which
                                 files), or refused (why)

**The start step, agreed without a collective.** The requester, not the ranks, picks the step:
every rank republishes its heartbeat every `BEAT_S` seconds, and the requester takes the step the
fastest rank will have reached when the request is seen (its heartbeat's step, plus its pace times
the heartbeat's age and `LEAD_S`), plus `MARGIN_STEPS` (the step in progress and one warm-up
step); never a step the configured schedule still traces. All ranks read the same step from the
same file, so they trace the same step numbers. Failure modes, each answered in the rank's answer:
a rank that sees the request only after its start step (its watcher thread starved for longer
than `LEAD_S`, or a rank much faster than its heartbeat said) refuses it as *missed* (a single
process starts at its next step instead; ``phaseprof capture`` asks again with a longer lead);
hosts whose clocks disagree by more than a few seconds misjudge the heartbeats' age (the lead
absorbs about a second); two requests written within a second of each other with overlapping
steps may be resolved differently by different ranks (a requester refuses to ask while another
request is pending, so this takes two requesters at once).

**What others write is hostile** (anyone who can write the logdir can write these files):

- every file is reached from the run directory one folder at a time, each opened relative to the
  one above with ``O_NOFOLLOW`` (`channel_folder`), and every file in it relative to that handle,
  on every read and write: a link put in place of ``.phaseprof``, ``capture`` or a file, before
  the job starts or while it runs, is never followed (the job warns once and stops writing there);
- every file is read with bounds (`read_small`): a regular file, not a link, at most
  `MAX_FILE_BYTES`, never blocking; decoded with strict types, and every number checked against
  a window (`check_beat`, `check_request`, `check_answer`): steps below `MAX_STEP`, a request's
  start within reach of the ranks' steps (`farthest_start`), times within `CLOCK_SKEW_S` of now,
  counts and texts small, paces finite and below `MAX_PACE`; anything else is ignored with a reason;
- a request carries its deadline (``expires``, at most `MAX_WAIT_S` after it was written): past it,
  no rank starts it and no requester waits on it, so no request blocks others for longer;
- every file carries its format (``format``, "major.minor", `FORMAT`): fields a newer minor version
  added are ignored; a major version this phaseprof does not know is refused in one line.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Iterator

import msgspec

from phaseprof import formats
from phaseprof.contract import CAPTURE_DIR

#: How often each rank's watcher republishes its heartbeat and looks for requests (seconds).
BEAT_S = 0.5
#: Time allowed from a request's writing to every rank seeing it, at the fastest rank's pace.
LEAD_S = 1.0
#: Steps added to the projected step: the step in progress, and one warm-up step before tracing.
MARGIN_STEPS = 2
#: A heartbeat older than this, not marked ended, belongs to a process that stopped without closing.
STALE_BEAT_S = 15.0
#: A request seen more than this long after it was written is not acted on (the job was stalled);
#: also the slack a request's deadline leaves after the slowest rank should have reached its start.
STALE_REQUEST_S = 60.0
#: The latest deadline a request may carry, after it was written: past its deadline no rank starts
#: it and no requester waits on it (so a job slower than a step per few minutes cannot be asked).
MAX_WAIT_S = 600.0
#: No request, answer or heartbeat is larger (a request is ~200 bytes).
MAX_FILE_BYTES = 8192
#: Steps one request may ask for; a rank also clamps it to its configured ``active``.
MAX_STEPS = 1000

# What a channel file may say: anything outside these bounds is ignored with a reason.
#: Step numbers (exact in a float; far beyond any run).
MAX_STEP = 2**53
#: The pace a heartbeat may claim, steps per second.
MAX_PACE = 1e6
#: The longest interval between two looks a heartbeat may claim, in seconds (it sets the lead).
MAX_LOOK_S = 30.0
#: How far ahead of a rank's step a request may start: this many seconds at the rank's pace, and at
#: least `MAX_STEPS` steps (a requester's lead is at most a few seconds past a heartbeat at most
#: `STALE_BEAT_S` old).
MAX_AHEAD_S = 60.0
#: A time may lie at most this far in the future (clocks of hosts sharing a disk disagree by less)
CLOCK_SKEW_S = 300.0
#: and not before 2001 (seconds since the epoch).
TIME_FLOOR = 1e9
#: Ranks (a file name carries at most six digits) and world sizes.
MAX_RANK = 999_999
#: An answer's reason, in characters; the trace files it names, and each name's length.
MAX_TEXT = 1000
MAX_FILES = 64
MAX_NAME = 255

#: The format of the files this phaseprof writes, "major.minor" (`phaseprof.formats`: a reader
#: ignores fields a newer minor version added, and refuses a major version it does not know). A file
#: without one is "1.0".
FORMAT = "1.2"
MAJOR = 1

REQUEST_RE = re.compile(r"^request\.(?P<id>[0-9a-f]{16})\.json$")
ANSWER_RE = re.compile(r"^answer\.(?P<id>[0-9a-f]{16})\.rank(?P<rank>\d{1,6})\.json$")
BEAT_RE = re.compile(r"^rank(?P<rank>\d{1,6})\.json$")

# States of an answer.
ACCEPTED, TRACING, WRITTEN, REFUSED = "accepted", "tracing", "written", "refused"
FINAL = (WRITTEN, REFUSED)
# Who asked.
BY_CLI, BY_TAB, BY_SLOWDOWN = "cli", "tab", "slowdown"


class Why(msgspec.Struct):
    """What made the slowdown trigger ask: the last steps' times against the run's own noise."""

    rank: int
    steps: list[int]
    step_ms: list[float]
    median_ms: float  # of the steps before them
    band_ms: float  # the noise band around that median


class Request(msgspec.Struct):
    id: str
    written: float  # seconds since the epoch
    by: str
    steps: int  # how many steps to trace
    start: int  # the first traced step, the same on every rank
    ranks: list[int] | None = None  # None: every rank
    why: Why | None = None
    expires: float | None = None  # no rank starts it later; None (format 1.0): `deadline`
    format: str = FORMAT

    def deadline(self) -> float:
        """When no rank starts it any more: ``expires``, else `STALE_REQUEST_S` after its time."""
        return self.written + STALE_REQUEST_S if self.expires is None else self.expires


class Answer(msgspec.Struct):
    id: str
    rank: int
    state: str
    updated: float
    first: int | None = None  # steps traced (or to be traced), inclusive
    last: int | None = None
    files: list[str] = []  # trace file names in the run directory
    reason: str | None = None  # why refused, or what shortened the trace
    format: str = FORMAT


class Heartbeat(msgspec.Struct):
    rank: int
    world_size: int
    step: int  # the step in progress
    time: float  # when this was written, seconds since the epoch
    steps_per_s: float  # recent pace; 0 before it is known
    active: int  # the configured window: the most steps one capture traces
    schedule_until: int | None  # the configured schedule profiles steps before this one; None: forever
    started: float  # when the process's profiler started
    ended: bool = False
    format: str = FORMAT
    #: seconds between two looks of its watcher (format 1.2); None: the default where it runs
    #: (`BEAT_S` on a disk, `phaseprof.capture_store.POLL_S` in a store)
    look_s: float | None = None


class _Format(msgspec.Struct):
    format: str = "1.0"


class Unreadable(Exception):
    """A channel file that is not what it should be; the message says why."""


class NotAFolder(Unreadable):
    """A folder on the way to the channel is a link (never followed) or not a folder."""


def is_remote(run_dir: str) -> bool:
    """Whether ``run_dir`` is a URL of a store (``s3://…``): its channel is objects
    (`phaseprof.capture_store`), not files."""
    from phaseprof.plugin.reading import storage

    return storage.is_remote(run_dir)


def capture_dir(run_dir: str) -> str:
    if is_remote(run_dir):
        return f"{run_dir.rstrip('/')}/{CAPTURE_DIR}"
    return os.path.join(run_dir, CAPTURE_DIR)


def lead(run_dir: str, beats: Iterable[Heartbeat] = ()) -> float:
    """The time allowed from a request's writing to every rank seeing it: `LEAD_S` on a disk; in a
    store, whose ranks look less often, the longest look of the ``beats`` (`look`) and
    `phaseprof.capture_store.SLACK_S`."""
    if is_remote(run_dir):
        from phaseprof import capture_store

        return look(run_dir, beats) + capture_store.SLACK_S
    return LEAD_S


def look(run_dir: str, beats: Iterable[Heartbeat] = ()) -> float:
    """The longest interval between two looks of the ranks' watchers, as their ``beats`` say (a
    beat of format 1.1 or older, or none: the default, `BEAT_S` or `capture_store.POLL_S`)."""
    if is_remote(run_dir):
        from phaseprof.capture_store import POLL_S as default
    else:
        default = BEAT_S
    return max((default if b.look_s is None else b.look_s for b in beats), default=default)


def request_name(request_id: str) -> str:
    return f"request.{request_id}.json"


def answer_name(request_id: str, rank: int) -> str:
    return f"answer.{request_id}.rank{rank}.json"


def beat_name(rank: int) -> str:
    return f"rank{rank}.json"


# -- the folder and its files, never through a link ---------------------------------------------

# (every POSIX platform has them; the getattr only lets the module import elsewhere)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


@contextlib.contextmanager
def channel_folder(run_dir: str, create: bool = False) -> Iterator[int]:
    """A handle on ``run_dir``'s capture folder, reached from ``run_dir`` one folder at a time, each
    opened relative to the one above without following a link (``create``: making the missing
    ones). `NotAFolder` (saying which, within the run) if one is a link or not a folder;
    FileNotFoundError if one is missing."""
    fd = os.open(run_dir, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        path = ""  # within the run, for messages
        for part in CAPTURE_DIR.split("/"):
            path = f"{path}/{part}" if path else part
            if create:
                with contextlib.suppress(FileExistsError):  # a link there exists too: refused below
                    os.mkdir(part, dir_fd=fd)
            try:
                flags = os.O_RDONLY | os.O_NONBLOCK | _DIRECTORY | _NOFOLLOW
                child = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                what = "a link (never followed)" if link else "not a folder"
                raise NotAFolder(f"{path} is {what}") from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read_small(folder: int, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``name`` in the folder ``folder`` (a handle) if it is a regular file (not a
    link) of at most ``limit`` bytes; else `Unreadable`. Opened without following links or
    blocking (a FIFO never hangs the reader)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=folder)
    except OSError as e:
        raise Unreadable("a link (never followed)" if e.errno == errno.ELOOP
                         else f"cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if st.st_size > limit:
            raise Unreadable(f"{st.st_size} bytes, more than {limit}")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise Unreadable(f"more than {limit} bytes")
        return data
    finally:
        os.close(fd)


def write_atomic(folder: int, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in the folder ``folder`` (a handle) through a temporary file and
    a rename, so that a reader never sees half a file; never through a link (a link named ``name``
    is replaced, not followed). The temporary file is removed when any of it fails."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=folder)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


class DiskFolder:
    """The capture folder on disk, by a handle reached without following a link: the same calls as
    `phaseprof.capture_store.StoreFolder`, so the job, the CLI and the tab read and write either."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path  # for messages

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in os.listdir(self.fd) if n.startswith(prefix))

    def read(self, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
        return read_small(self.fd, name, limit)

    def read_many(self, names: list[str], limit: int = MAX_FILE_BYTES) -> dict[str, bytes | Unreadable]:
        out: dict[str, bytes | Unreadable] = {}
        for name in names:
            try:
                out[name] = read_small(self.fd, name, limit)
            except Unreadable as e:
                out[name] = e
        return out

    def write(self, name: str, data: bytes) -> None:
        write_atomic(self.fd, name, data)


@contextlib.contextmanager
def open_folder(run_dir: str, create: bool = False) -> Iterator[DiskFolder]:
    """The run's capture folder: on disk, reached without following a link (`channel_folder`:
    `NotAFolder`, FileNotFoundError); in a store, its prefix (`StoreFolder`: nothing to create, and
    its calls raise `StoreError`)."""
    if is_remote(run_dir):
        from phaseprof.capture_store import StoreFolder

        yield StoreFolder(run_dir, CAPTURE_DIR)
        return
    with channel_folder(run_dir, create) as fd:
        yield DiskFolder(fd, capture_dir(run_dir))


# -- decoding and bounds ------------------------------------------------------------------------


def decode(data: bytes, kind: type[msgspec.Struct]):
    """``data`` as a ``kind`` (strict types; fields it does not know, from a newer minor format,
    ignored), else `Unreadable` with the decoder's reason, or the format it cannot read."""
    try:
        formats.check(msgspec.json.decode(data, type=_Format).format, MAJOR)
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as e:
        raise Unreadable(f"not a {kind.__name__}: {e}") from None
    except formats.OtherFormat as e:
        raise Unreadable(str(e)) from None


def _short(value) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # (repr refuses past 4,300 digits)
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _step(value: int | None, what: str) -> None:
    if value is not None and not 0 <= value <= MAX_STEP:
        raise Unreadable(f"{what} {_short(value)} is not a step number (0..2**53)")


def _rank(value: int, what: str = "rank") -> None:
    if not 0 <= value <= MAX_RANK:
        raise Unreadable(f"{what} {_short(value)} is not a rank (0..{MAX_RANK})")


def _time(value: float, what: str, now: float) -> None:
    if not (math.isfinite(value) and TIME_FLOOR <= value <= now + CLOCK_SKEW_S):
        raise Unreadable(f"{what} {_short(value)} is not a time before now "
                         f"(+{CLOCK_SKEW_S:.0f} s of clock skew)")


def _name_rank(name: str, pattern: re.Pattern) -> tuple[str | None, int]:
    m = pattern.match(name)
    return m.groupdict().get("id"), int(m["rank"])


def check_beat(beat: Heartbeat, rank: int, now: float) -> Heartbeat:
    """``beat`` if it is rank ``rank``'s (its file name's) and its values lie within bounds, else
    `Unreadable`."""
    if beat.rank != rank:
        raise Unreadable(f"its rank {_short(beat.rank)} is not its file name's")
    _rank(beat.rank)
    if not 1 <= beat.world_size <= MAX_RANK + 1:
        raise Unreadable(f"world size {_short(beat.world_size)} is not 1..{MAX_RANK + 1}")
    _step(beat.step, "step")
    _step(beat.schedule_until, "schedule end")
    if not 1 <= beat.active <= MAX_STEP:
        raise Unreadable(f"active {_short(beat.active)} is not a step count")
    if not (math.isfinite(beat.steps_per_s) and 0 <= beat.steps_per_s <= MAX_PACE):
        raise Unreadable(f"pace {_short(beat.steps_per_s)} is not 0..{MAX_PACE:.0e} steps/s")
    _time(beat.time, "time", now)
    _time(beat.started, "start time", now)
    if beat.started > beat.time:
        raise Unreadable("it started after it was written")
    look_s = beat.look_s
    if look_s is not None and not (math.isfinite(look_s) and 0 < look_s <= MAX_LOOK_S):
        raise Unreadable(f"look interval {_short(look_s)} is not 0..{MAX_LOOK_S:.0f} s")
    return beat


def check_request(request: Request, file_id: str, now: float | None = None) -> Request:
    """``request`` if its values make sense (the id of its file name, a step count, step numbers,
    times, a deadline at most `MAX_WAIT_S` after it was written), else `Unreadable`."""
    now = time.time() if now is None else now
    if request.id != file_id:
        raise Unreadable(f"its id {_short(request.id)} is not its file name's")
    if not 1 <= request.steps <= MAX_STEPS:
        raise Unreadable(f"steps must lie in 1..{MAX_STEPS}, not {_short(request.steps)}")
    if request.start < 0 or (request.ranks is not None and any(r < 0 for r in request.ranks)):
        raise Unreadable("negative step or rank")
    _step(request.start, "start step")
    if request.ranks is not None:
        if len(request.ranks) > MAX_STEPS:
            raise Unreadable(f"{len(request.ranks)} ranks, more than {MAX_STEPS}")
        for r in request.ranks:
            _rank(r)
    if request.by not in (BY_CLI, BY_TAB, BY_SLOWDOWN):
        raise Unreadable(f"unknown requester {_short(request.by)}")
    if not math.isfinite(request.written):
        raise Unreadable("its time is not a number")
    _time(request.written, "its time", now)
    expires = request.expires
    if expires is not None and not (math.isfinite(expires)
                                    and request.written <= expires <= request.written + MAX_WAIT_S):
        raise Unreadable(f"its deadline {_short(expires)} is not within {MAX_WAIT_S:.0f} s of its "
                         "time")
    if request.why is not None:
        _check_why(request.why)
    return request


def _check_why(why: Why) -> None:
    _rank(why.rank)
    if len(why.steps) > MAX_STEPS or len(why.step_ms) > MAX_STEPS:
        raise Unreadable(f"why: more than {MAX_STEPS} steps")
    for s in why.steps:
        _step(s, "why: step")
    if not all(math.isfinite(v) and v >= 0 for v in (*why.step_ms, why.median_ms, why.band_ms)):
        raise Unreadable("why: a time that is not a finite, non-negative number")


def check_answer(answer: Answer, file_id: str, rank: int, now: float) -> Answer:
    """``answer`` if it answers its file name's request for its file name's rank and its values
    lie within bounds, else `Unreadable`."""
    if answer.id != file_id or answer.rank != rank:
        raise Unreadable("its id or rank is not its file name's")
    if answer.state not in (ACCEPTED, TRACING, WRITTEN, REFUSED):
        raise Unreadable(f"unknown state {_short(answer.state)}")
    _time(answer.updated, "its time", now)
    _step(answer.first, "first step")
    _step(answer.last, "last step")
    if (answer.first is None) != (answer.last is None) or (
            answer.first is not None and not 0 <= answer.last - answer.first < MAX_STEPS):
        raise Unreadable(f"steps {_short(answer.first)}–{_short(answer.last)} are not a capture's")
    names = answer.files
    if len(names) > MAX_FILES or any(len(f) > MAX_NAME or "/" in f or "\0" in f for f in names):
        raise Unreadable("its files are not a few trace file names")
    if answer.reason is not None and len(answer.reason) > MAX_TEXT:
        raise Unreadable(f"its reason is longer than {MAX_TEXT} characters")
    return answer


def farthest_start(step: int, steps_per_s: float) -> int:
    """The farthest start step a request may ask of a rank at ``step`` going at ``steps_per_s``:
    `MAX_AHEAD_S` at its pace, at least `MAX_STEPS` steps, past the margin."""
    return step + MARGIN_STEPS + max(MAX_STEPS, math.ceil(min(steps_per_s, MAX_PACE) * MAX_AHEAD_S))


# -- what the requester reads -------------------------------------------------------------------


class Channel(msgspec.Struct):
    """What a run's capture folder holds, read once."""

    beats: dict[int, Heartbeat]
    requests: list[Request]  # oldest first
    answers: dict[str, dict[int, Answer]]  # request id -> rank -> answer
    ignored: list[str]  # "path: why" (in the run): files or folders not what they should be


def read_channel(run_dir: str, now: float | None = None) -> Channel:
    """The heartbeats, requests and answers under ``run_dir`` (a folder or a store's URL; none if
    the folder is missing); never raises: a folder or file that is not what it should be, or a store
    that fails, is listed in ``ignored``, with why."""
    now = time.time() if now is None else now
    out = Channel(beats={}, requests=[], answers={}, ignored=[])
    try:
        with open_folder(run_dir) as folder:
            names = [n for n in folder.names() if BEAT_RE.match(n) or REQUEST_RE.match(n)
                     or ANSWER_RE.match(n)]
            for name, data in folder.read_many(names).items():
                try:
                    if isinstance(data, Unreadable):
                        raise data
                    _read_entry(name, data, now, out)
                except Unreadable as e:
                    out.ignored.append(f"{CAPTURE_DIR}/{name}: {e}")
    except FileNotFoundError:
        pass
    except NotAFolder as e:
        out.ignored.append(str(e))
    except OSError as e:
        out.ignored.append(f"{CAPTURE_DIR}: cannot be read: {e.strerror or e}")
    out.ignored.sort()
    out.requests.sort(key=lambda r: (r.written, r.id))
    return out


def _read_entry(name: str, data: bytes, now: float, out: Channel) -> None:
    if BEAT_RE.match(name):
        _, rank = _name_rank(name, BEAT_RE)
        out.beats[rank] = check_beat(decode(data, Heartbeat), rank, now)
    elif m := REQUEST_RE.match(name):
        out.requests.append(check_request(decode(data, Request), m["id"], now))
    elif ANSWER_RE.match(name):
        request_id, rank = _name_rank(name, ANSWER_RE)
        answer = check_answer(decode(data, Answer), request_id, rank, now)
        out.answers.setdefault(request_id, {})[rank] = answer


def live_beats(channel: Channel, now: float | None = None) -> tuple[dict[int, Heartbeat], str | None]:
    """The heartbeats of ranks still running, or none and why the run cannot be asked."""
    now = time.time() if now is None else now
    beats = channel.beats
    if not beats:
        ignored = f" (ignored: {'; '.join(channel.ignored[:3])})" if channel.ignored else ""
        return {}, ("no running PhaseProfiler watches this run for capture requests (it has not started, or it "
                    f"was written by another tool or an older phaseprof){ignored}")
    if all(b.ended for b in beats.values()):
        last = max(beats.values(), key=lambda b: b.time)
        return {}, f"the run ended at step {last.step} ({_ago(now - last.time)})"
    live = {r: b for r, b in beats.items() if not b.ended and now - b.time <= STALE_BEAT_S}
    if not live:
        last = max(beats.values(), key=lambda b: b.time)
        return {}, f"the run stopped writing at step {last.step} ({_ago(now - last.time)}) without closing its profiler"
    return live, None


def pending(channel: Channel, now: float | None = None) -> Request | None:
    """A request some rank has not answered finally yet, if any: only before its deadline, and only
    if its start is within reach of a rank's step (a rank refuses the others)."""
    now = time.time() if now is None else now
    reach = max((farthest_start(b.step, b.steps_per_s) for b in channel.beats.values()), default=0)
    for request in reversed(channel.requests):
        if now > request.deadline() or request.start > reach:
            continue
        answers = channel.answers.get(request.id, {})
        ranks = request.ranks if request.ranks is not None else list(channel.beats)
        if any(r in channel.beats and not channel.beats[r].ended and (r not in answers or answers[r].state not in FINAL)
               for r in ranks):
            return request
    return None


def plan_request(run_dir: str, steps: int | None = None, ranks: list[int] | None = None, by: str = BY_CLI,
                 lead_s: float | None = None, why: Why | None = None, now: float | None = None) -> Request:
    """The request to write for a trace of ``steps`` steps of the run (default: the configured
    window, ``active``), or ValueError saying why the run cannot be asked (it ended, it is not
    watched, another capture is pending). ``lead_s``: default `lead` (the run's)."""
    now = time.time() if now is None else now
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must lie in 1..{MAX_STEPS}, not {steps}")
    channel = read_channel(run_dir, now)
    live, why_not = live_beats(channel, now)
    if why_not:
        raise ValueError(why_not)
    steps = steps or min(MAX_STEPS, *(b.active for b in live.values()))
    if ranks is not None:
        missing = sorted(set(ranks) - set(live))
        if missing:
            running = ", ".join(map(str, sorted(live)))
            raise ValueError(f"no running rank {', '.join(map(str, missing))} (running: {running})")
    waiting = pending(channel, now)
    if waiting is not None:
        raise ValueError(f"another capture is running: {describe(waiting)}")
    forever = [r for r, b in live.items() if b.schedule_until is None]
    if forever:
        raise ValueError(f"rank {forever[0]} traces every cycle of its schedule (repeat=0): its traces already "
                         "cover the run")
    lead_s = lead(run_dir, live.values()) if lead_s is None else lead_s
    start = start_step(live.values(), now, lead_s)
    return Request(id=secrets.token_hex(8), written=now, by=by, steps=steps, start=start,
                   ranks=sorted(set(ranks)) if ranks is not None else None, why=why,
                   expires=expiry(start, live.values(), now))


def start_step(beats: Iterable[Heartbeat], now: float, lead_s: float = LEAD_S) -> int:
    """The first step to trace on every rank: where the fastest rank will be once every rank has
    seen the request, plus `MARGIN_STEPS`, and after every rank's configured schedule. (Bounded:
    a live heartbeat's step, pace and age are.)"""
    beats = list(beats)
    projected = max(b.step + b.steps_per_s * (max(0.0, now - b.time) + lead_s) for b in beats)
    after_schedule = max((b.schedule_until or 0) + 1 for b in beats)
    return max(math.ceil(projected) + MARGIN_STEPS, after_schedule)


def expiry(start: int, beats: Iterable[Heartbeat], now: float) -> float:
    """A request's deadline: when the slowest rank, at its pace, should have reached ``start``,
    plus `STALE_REQUEST_S`; at most `MAX_WAIT_S` from ``now`` (also when a pace is not known
    yet)."""
    wait = 0.0
    for b in beats:
        if b.steps_per_s <= 0:
            return now + MAX_WAIT_S
        # seconds until it reaches the start: the steps left at its pace, less the beat's age
        wait = max(wait, (start - b.step) / b.steps_per_s - (now - b.time))
    return now + min(MAX_WAIT_S, wait + STALE_REQUEST_S)


def write_request(run_dir: str, request: Request) -> str:
    """Write ``request`` into the run's capture folder (which must exist: a running profiler made
    it), reached without following a link; returns its path. ValueError if the folder is missing,
    a link or not a folder; OSError if it cannot be written (`StoreError` for a store)."""
    try:
        with open_folder(run_dir) as folder:
            folder.write(request_name(request.id), msgspec.json.encode(request))
            return folder.where(request_name(request.id))
    except (FileNotFoundError, NotAFolder) as e:
        detail = str(e) if isinstance(e, NotAFolder) else "missing"
        folder = capture_dir(run_dir)
        raise ValueError(f"{folder} is not a folder a running profiler made ({detail})") from None


def targets(request: Request, channel: Channel) -> list[int]:
    """The ranks that should answer ``request``: those asked, of those whose heartbeat is in."""
    return sorted(r for r in channel.beats if request.ranks is None or r in request.ranks)


def describe(request: Request) -> str:
    who = {BY_CLI: "asked from the terminal", BY_TAB: "asked from the tab", BY_SLOWDOWN: "taken on a slowdown"}
    return f"steps {request.start}–{request.start + request.steps - 1}, {who.get(request.by, request.by)}"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
