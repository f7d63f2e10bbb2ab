"""``phaseprof capture``: ask a running job for a trace of its next steps, and (``--wait``) wait for
every rank's answer, then analyse the traces so that ``report`` and TensorBoard find them ready.

Everything printed that came from a channel file, a path or an argument is plain text (`shown`):
another writer of the logdir cannot send the terminal an escape sequence."""

from __future__ import annotations

import os
import sys
import time

from phaseprof.capture_channel import (
    BEAT_RE,
    BEAT_S,
    FINAL,
    REFUSED,
    STALE_BEAT_S,
    WRITTEN,
    Answer,
    Request,
    lead,
    live_beats,
    look,
    plan_request,
    read_channel,
    targets,
    write_request,
)
from phaseprof.contract import ANALYSIS_DIR, CAPTURE_DIR
from phaseprof.plugin.reading import storage

from .terminal import shown

#: Times a request all ranks missed the start of is asked again, each with twice the lead.
RETRIES = 3


def capture(logdir: str, run: str | None = None, steps: int | None = None, ranks: list[int] | None = None,
            wait: bool = False, timeout: float = 600.0, out=None) -> int:
    out = out or sys.stdout
    try:
        run_dir = find_run(logdir, run)
    except (ValueError, storage.StorageError) as e:
        _say(f"phaseprof capture: {e}", sys.stderr)
        return 2
    channel = read_channel(run_dir)
    for line in channel.ignored:  # each file another writer got wrong, once
        _say(f"phaseprof capture: {run_dir}: ignored {line}", sys.stderr)
    deadline = time.monotonic() + timeout
    lead_s = lead(run_dir, channel.beats.values())  # (ranks' looks, as their heartbeats say)
    pause = look(run_dir, channel.beats.values()) / 2  # between two looks of this one
    for _ in range(RETRIES + 1):
        try:
            request = plan_request(run_dir, steps, ranks, lead_s=lead_s)
            write_request(run_dir, request)
        except (ValueError, OSError) as e:
            _say(f"phaseprof capture: {run_dir}: not asked: {e}", sys.stderr)
            return 1
        on = "every rank" if request.ranks is None else "rank " + ", ".join(map(str, request.ranks))
        last = request.start + request.steps - 1
        _say(f"asked {run_dir} for a trace of steps {request.start}–{last} on {on} "
             f"(request {request.id})", out)
        if not wait:
            return 0
        answers = wait_for_answers(run_dir, request, deadline, pause)
        if answers is None:
            _say(f"phaseprof capture: no answer from every rank within {timeout:.0f} s", sys.stderr)
            return 1
        missed = [a for a in answers.values() if a.state == REFUSED and (a.reason or "").startswith("missed")]
        if not missed:
            break
        lead_s *= 2
        _say(f"rank {missed[0].rank} {missed[0].reason}: asking again with a longer lead", out)
    return _report(run_dir, answers, out, deadline, pause)


def _say(line: str, out) -> None:
    """One line as plain text: names, paths and reasons from files escaped, never sent raw."""
    print(shown(line), file=out)


def find_run(logdir: str, run: str | None) -> str:
    """The run directory to ask: ``logdir/run``, else the one run under ``logdir`` still running."""
    if storage.is_remote(logdir):
        storage.filesystem(logdir)  # StorageError, naming the extra to install, if it is missing
        return _find_run_in_store(storage.normalize(logdir), run)
    if not os.path.isdir(logdir):
        raise ValueError(f"{logdir}: no such directory")
    if run is not None:
        parts = run.replace("\\", "/").split("/")
        path = os.path.join(logdir, run)
        if os.path.isabs(run) or ".." in parts or not _inside(logdir, path):
            raise ValueError(f"--run {run!r} must be a run directory inside {logdir}")
        if not os.path.isdir(path):
            raise ValueError(f"{path}: no such run directory")
        return path
    watched = []
    for directory, subdirs, _ in os.walk(logdir):  # (links to folders are not walked into)
        if ANALYSIS_DIR in subdirs:  # its channel is read without following a link
            watched.append(directory)
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
    return _the_running_one(logdir, watched, lambda d: os.path.relpath(d, logdir))


def _the_running_one(logdir: str, watched: list[str], relative) -> str:
    running = [d for d in watched if not live_beats(read_channel(d))[1]]
    if len(running) == 1:
        return running[0]
    if not running:
        raise ValueError(f"no run under {logdir} is running a PhaseProfiler that watches for requests "
                         f"(its {CAPTURE_DIR}/ holds a fresh heartbeat)")
    names = ", ".join(relative(d) for d in running)
    raise ValueError(f"several runs under {logdir} are running ({names}): name one with --run")


def _find_run_in_store(logdir: str, run: str | None) -> str:
    """`find_run` for a logdir in a store: ``--run`` a plain relative name; else the runs whose
    capture folder holds a heartbeat (one listing of the logdir), of them the one still running."""
    if run is not None:
        parts = run.replace("\\", "/").split("/")
        if run.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"--run {run!r} must be a run directory inside {logdir}")
        return storage.join(logdir, *parts)
    suffix = "/" + CAPTURE_DIR
    try:
        entries = storage.listing(logdir)
    except Exception as e:  # noqa: BLE001 - each store's client raises its own kinds
        raise ValueError(f"{logdir}: cannot list it ({e})") from None
    watched = sorted({storage.dirname(e.url)[:-len(suffix)] for e in entries
                      if storage.dirname(e.url).endswith(suffix) and BEAT_RE.match(storage.basename(e.url))})
    return _the_running_one(logdir, watched, lambda d: storage.relpath(d, logdir))


def _inside(logdir: str, path: str) -> bool:
    """Whether ``path``, its links resolved, lies inside ``logdir``'s resolved path."""
    root, real = os.path.realpath(logdir), os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def wait_for_answers(run_dir: str, request: Request, deadline: float,
                     pause: float = BEAT_S / 2) -> dict[int, Answer] | None:
    """Every asked rank's final answer (a rank that ended or stopped without one is refused),
    or None at the deadline; the channel read every ``pause`` seconds."""
    while time.monotonic() < deadline:
        channel = read_channel(run_dir)
        answers = channel.answers.get(request.id, {})
        done: dict[int, Answer] = {}
        for rank in targets(request, channel):
            answer, beat = answers.get(rank), channel.beats[rank]
            if answer is not None and answer.state in FINAL:
                done[rank] = answer
            elif beat.ended or time.time() - beat.time > STALE_BEAT_S:
                done[rank] = Answer(id=request.id, rank=rank, state=REFUSED, updated=beat.time,
                                    reason=f"the run ended at step {beat.step} without answering")
        if done and len(done) == len(targets(request, channel)):
            return done
        time.sleep(pause)
    return None


def _report(run_dir: str, answers: dict[int, Answer], out, deadline: float, pause: float) -> int:
    from phaseprof.plugin.reading.errors import TraceError
    from phaseprof.plugin.spans import analyze_file

    named = {name for a in answers.values() if a.state == WRITTEN for name in a.files}
    files = _trace_files(run_dir, named, deadline, pause)
    failed = 0
    for rank, answer in sorted(answers.items()):
        if answer.state != WRITTEN:
            _say(f"rank {rank}: refused: {answer.reason}", out)
            failed += 1
            continue
        note = f" ({answer.reason})" if answer.reason else ""
        _say(f"rank {rank}: steps {answer.first}–{answer.last}{note}", out)
        for name in answer.files:
            f = files.get(name)
            try:
                if f is None:
                    raise TraceError("not found beside the run")
                steps = analyze_file(f).steps  # the analysis the job started, else made now
                _say(f"  {name}: {len(steps)} steps analysed", out)
            except TraceError as e:
                _say(f"  {name}: cannot be read: {e.reason}", out)
                failed += 1
    return 1 if failed else 0


def _trace_files(run_dir: str, names: set[str], deadline: float, pause: float) -> dict:
    """The run's trace files by name; in a store, once those ``names`` are there (the job uploads a
    trace a few seconds after writing it) or at the deadline."""
    from phaseprof.plugin.reading.discovery import discover

    while True:
        try:
            files = {f.name: f for r in discover(run_dir) for f in r.files}
        except OSError:  # the store did not answer: tried again until the deadline
            files = {}
        if not storage.is_remote(run_dir) or names <= set(files) or time.monotonic() > deadline:
            return files
        time.sleep(pause)
