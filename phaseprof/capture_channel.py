"""The capture channel: how a viewer (``phaseprof capture``, the tab's button, the slowdown trigger)
asks a running training job for a trace of its next steps, through files under the run.

Torch-free: the training side (`phaseprof.training_hooks.capture`) and the TensorBoard side (the
CLI, the plugin's ``/capture`` route) both import it. Everything lives in
``<run>/.phaseprof/capture/`` (`phaseprof.contract.CAPTURE_DIR`)::

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

Every file is read with bounds (`read_small`): only a regular file, not a link, at most
`MAX_FILE_BYTES`, decoded strictly into its Struct; anything else is ignored with a reason.
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

import msgspec

from phaseprof.contract import CAPTURE_DIR

#: How often each rank's watcher republishes its heartbeat and looks for requests (seconds).
BEAT_S = 0.5
#: Time allowed from a request's writing to every rank seeing it, at the fastest rank's pace.
LEAD_S = 1.0
#: Steps added to the projected step: the step in progress, and one warm-up step before tracing.
MARGIN_STEPS = 2
#: A heartbeat older than this, not marked ended, belongs to a process that stopped without closing.
STALE_BEAT_S = 15.0
#: A request seen more than this long after it was written is not acted on (the job was stalled).
STALE_REQUEST_S = 60.0
#: Why a run whose logdir is in an object store (``s3://…``) takes no capture request: its channel is
#: files beside the run that the job and whoever asks both read and write, which needs a shared disk.
IN_A_STORE = ("the logdir is in an object store: on-request capture needs the run's folder on a disk the "
              "training job and the asker share (a run written to a store is traced only as its schedule says)")
#: No request, answer or heartbeat is larger (a request is ~200 bytes).
MAX_FILE_BYTES = 8192
#: Steps one request may ask for; a rank also clamps it to its configured ``active``.
MAX_STEPS = 1000

REQUEST_RE = re.compile(r"^request\.(?P<id>[0-9a-f]{16})\.json$")
ANSWER_RE = re.compile(r"^answer\.(?P<id>[0-9a-f]{16})\.rank(?P<rank>\d{1,6})\.json$")
BEAT_RE = re.compile(r"^rank(?P<rank>\d{1,6})\.json$")

# States of an answer.
ACCEPTED, TRACING, WRITTEN, REFUSED = "accepted", "tracing", "written", "refused"
FINAL = (WRITTEN, REFUSED)
# Who asked.
BY_CLI, BY_TAB, BY_SLOWDOWN = "cli", "tab", "slowdown"


class Why(msgspec.Struct, forbid_unknown_fields=True):
    """What made the slowdown trigger ask: the last steps' times against the run's own noise."""

    rank: int
    steps: list[int]
    step_ms: list[float]
    median_ms: float  # of the steps before them
    band_ms: float  # the noise band around that median


class Request(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    written: float  # seconds since the epoch
    by: str
    steps: int  # how many steps to trace
    start: int  # the first traced step, the same on every rank
    ranks: list[int] | None = None  # None: every rank
    why: Why | None = None


class Answer(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    rank: int
    state: str
    updated: float
    first: int | None = None  # steps traced (or to be traced), inclusive
    last: int | None = None
    files: list[str] = []  # trace file names in the run directory
    reason: str | None = None  # why refused, or what shortened the trace


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    rank: int
    world_size: int
    step: int  # the step in progress
    time: float  # when this was written, seconds since the epoch
    steps_per_s: float  # recent pace; 0 before it is known
    active: int  # the configured window: the most steps one capture traces
    schedule_until: int | None  # the configured schedule profiles steps before this one; None: forever
    started: float  # when the process's profiler started
    ended: bool = False


class Unreadable(Exception):
    """A channel file that is not what it should be; the message says why."""


def capture_dir(run_dir: str) -> str:
    return os.path.join(run_dir, CAPTURE_DIR)


def request_name(request_id: str) -> str:
    return f"request.{request_id}.json"


def answer_name(request_id: str, rank: int) -> str:
    return f"answer.{request_id}.rank{rank}.json"


def beat_name(rank: int) -> str:
    return f"rank{rank}.json"


def read_small(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link) of at most ``limit`` bytes; else
    `Unreadable`. Opened without following links or blocking (a FIFO never hangs the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise Unreadable("a link, or cannot be opened" if os.path.islink(path) else f"cannot be opened: {e}") from None
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


def decode(data: bytes, kind: type[msgspec.Struct]):
    """``data`` strictly as a ``kind``, else `Unreadable` with the decoder's reason."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as e:
        raise Unreadable(f"not a {kind.__name__}: {e}") from None


def check_request(request: Request, file_id: str) -> Request:
    """``request`` if its values make sense (the id of its file name, a step count, step numbers),
    else `Unreadable`."""
    if request.id != file_id:
        raise Unreadable(f"its id {request.id!r} is not its file name's")
    if not 1 <= request.steps <= MAX_STEPS:
        raise Unreadable(f"steps must lie in 1..{MAX_STEPS}, not {request.steps}")
    if request.start < 0 or (request.ranks is not None and any(r < 0 for r in request.ranks)):
        raise Unreadable("negative step or rank")
    if request.by not in (BY_CLI, BY_TAB, BY_SLOWDOWN):
        raise Unreadable(f"unknown requester {request.by!r}")
    if not math.isfinite(request.written):
        raise Unreadable("its time is not a number")
    return request


def write_atomic(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` as ``directory/name`` through a temporary file and a rename, so that a
    reader never sees half a file; never through a link. If it fails (a full disk), the temporary
    file is removed."""
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write", tmp)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# -- what the requester reads -------------------------------------------------------------------


class Channel(msgspec.Struct):
    """What a run's capture folder holds, read once."""

    beats: dict[int, Heartbeat]
    requests: list[Request]  # oldest first
    answers: dict[str, dict[int, Answer]]  # request id -> rank -> answer
    ignored: list[str]  # "name: why", for files that are not what they should be


def read_channel(run_dir: str) -> Channel:
    """The heartbeats, requests and answers under ``run_dir`` (none if the folder is missing)."""
    folder = capture_dir(run_dir)
    out = Channel(beats={}, requests=[], answers={}, ignored=[])
    try:
        if os.path.islink(folder):
            out.ignored.append(f"{CAPTURE_DIR}: a link")
            return out
        entries = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in entries:
        try:
            if m := BEAT_RE.match(name):
                beat = decode(read_small(os.path.join(folder, name)), Heartbeat)
                out.beats[beat.rank] = beat
            elif m := REQUEST_RE.match(name):
                out.requests.append(check_request(decode(read_small(os.path.join(folder, name)), Request), m["id"]))
            elif m := ANSWER_RE.match(name):
                answer = decode(read_small(os.path.join(folder, name)), Answer)
                out.answers.setdefault(answer.id, {})[answer.rank] = answer
        except Unreadable as e:
            out.ignored.append(f"{name}: {e}")
    out.requests.sort(key=lambda r: (r.written, r.id))
    return out


def live_beats(channel: Channel, now: float | None = None) -> tuple[dict[int, Heartbeat], str | None]:
    """The heartbeats of ranks still running, or none and why the run cannot be asked."""
    now = time.time() if now is None else now
    beats = channel.beats
    if not beats:
        return {}, ("no running PhaseProfiler watches this run for capture requests (it has not started, or it "
                    "was written by another tool or an older phaseprof)")
    if all(b.ended for b in beats.values()):
        last = max(beats.values(), key=lambda b: b.time)
        return {}, f"the run ended at step {last.step} ({_ago(now - last.time)})"
    live = {r: b for r, b in beats.items() if not b.ended and now - b.time <= STALE_BEAT_S}
    if not live:
        last = max(beats.values(), key=lambda b: b.time)
        return {}, f"the run stopped writing at step {last.step} ({_ago(now - last.time)}) without closing its profiler"
    return live, None


def pending(channel: Channel, now: float | None = None) -> Request | None:
    """A request some rank has not answered finally yet (and not abandoned), if any."""
    now = time.time() if now is None else now
    for request in reversed(channel.requests):
        if now - request.written > STALE_REQUEST_S + request.steps * 60:
            continue
        answers = channel.answers.get(request.id, {})
        ranks = request.ranks if request.ranks is not None else list(channel.beats)
        if any(r in channel.beats and not channel.beats[r].ended and (r not in answers or answers[r].state not in FINAL)
               for r in ranks):
            return request
    return None


def plan_request(run_dir: str, steps: int | None = None, ranks: list[int] | None = None, by: str = BY_CLI,
                 lead_s: float = LEAD_S, why: Why | None = None, now: float | None = None) -> Request:
    """The request to write for a trace of ``steps`` steps of the run (default: the configured
    window, ``active``), or ValueError saying why the run cannot be asked (it ended, it is not
    watched, another capture is pending)."""
    now = time.time() if now is None else now
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must lie in 1..{MAX_STEPS}, not {steps}")
    channel = read_channel(run_dir)
    live, why_not = live_beats(channel, now)
    if why_not:
        raise ValueError(why_not)
    steps = steps or min(b.active for b in live.values())
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
    start = start_step(live.values(), now, lead_s)
    return Request(id=secrets.token_hex(8), written=now, by=by, steps=steps, start=start,
                   ranks=sorted(set(ranks)) if ranks is not None else None, why=why)


def start_step(beats, now: float, lead_s: float = LEAD_S) -> int:
    """The first step to trace on every rank: where the fastest rank will be once every rank has
    seen the request, plus `MARGIN_STEPS`, and after every rank's configured schedule."""
    projected = max(b.step + b.steps_per_s * (max(0.0, now - b.time) + lead_s) for b in beats)
    after_schedule = max((b.schedule_until or 0) + 1 for b in beats)
    return max(math.ceil(projected) + MARGIN_STEPS, after_schedule)


def write_request(run_dir: str, request: Request) -> str:
    """Write ``request`` into the run's capture folder (which must exist: a running profiler made
    it); returns its path."""
    folder = capture_dir(run_dir)
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a folder a running profiler made")
    return write_atomic(folder, request_name(request.id), msgspec.json.encode(request))


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
