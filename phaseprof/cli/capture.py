"""``phaseprof capture``: ask a running job for a trace of its next steps, and (``--wait``) wait for
every rank's answer, then analyse the traces so that ``report`` and TensorBoard find them ready."""

from __future__ import annotations

import os
import sys
import time

from phaseprof.capture_channel import (
    BEAT_S,
    FINAL,
    IN_A_STORE,
    LEAD_S,
    REFUSED,
    STALE_BEAT_S,
    WRITTEN,
    Answer,
    Request,
    capture_dir,
    live_beats,
    plan_request,
    read_channel,
    targets,
    write_request,
)
from phaseprof.contract import CAPTURE_DIR
from phaseprof.plugin.reading import storage

#: Times a request all ranks missed the start of is asked again, each with twice the lead.
RETRIES = 3


def capture(logdir: str, run: str | None = None, steps: int | None = None, ranks: list[int] | None = None,
            wait: bool = False, timeout: float = 600.0, out=None) -> int:
    out = out or sys.stdout
    if storage.is_remote(logdir):
        print(f"phaseprof capture: {logdir}: {IN_A_STORE}", file=sys.stderr)
        return 2
    try:
        run_dir = find_run(logdir, run)
    except ValueError as e:
        print(f"phaseprof capture: {e}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + timeout
    lead = LEAD_S
    for _ in range(RETRIES + 1):
        try:
            request = plan_request(run_dir, steps, ranks, lead_s=lead)
            write_request(run_dir, request)
        except (ValueError, OSError) as e:
            print(f"phaseprof capture: {run_dir}: not asked: {e}", file=sys.stderr)
            return 1
        ranks = "every rank" if request.ranks is None else "rank " + ", ".join(map(str, request.ranks))
        print(f"asked {run_dir} for a trace of steps {request.start}–{request.start + request.steps - 1} on {ranks} "
              f"(request {request.id})", file=out)
        if not wait:
            return 0
        answers = wait_for_answers(run_dir, request, deadline)
        if answers is None:
            print(f"phaseprof capture: no answer from every rank within {timeout:.0f} s", file=sys.stderr)
            return 1
        missed = [a for a in answers.values() if a.state == REFUSED and (a.reason or "").startswith("missed")]
        if not missed:
            break
        lead *= 2
        print(f"rank {missed[0].rank} {missed[0].reason}: asking again with a longer lead", file=out)
    return _report(run_dir, answers, out)


def find_run(logdir: str, run: str | None) -> str:
    """The run directory to ask: ``logdir/run``, else the one run under ``logdir`` still running."""
    if not os.path.isdir(logdir):
        raise ValueError(f"{logdir}: no such directory")
    if run is not None:
        parts = run.replace("\\", "/").split("/")
        if os.path.isabs(run) or ".." in parts:
            raise ValueError(f"--run {run!r} must be a run directory inside {logdir}")
        path = os.path.join(logdir, run)
        if not os.path.isdir(path):
            raise ValueError(f"{path}: no such run directory")
        return path
    watched = []
    for directory, subdirs, _ in os.walk(logdir):
        if os.path.isdir(capture_dir(directory)):
            watched.append(directory)
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
    running = [d for d in watched if not live_beats(read_channel(d))[1]]
    if len(running) == 1:
        return running[0]
    if not running:
        raise ValueError(f"no run under {logdir} is running a PhaseProfiler that watches for requests "
                         f"(its {CAPTURE_DIR}/ holds a fresh heartbeat)")
    names = ", ".join(os.path.relpath(d, logdir) for d in running)
    raise ValueError(f"several runs under {logdir} are running ({names}): name one with --run")


def wait_for_answers(run_dir: str, request: Request, deadline: float) -> dict[int, Answer] | None:
    """Every asked rank's final answer (a rank that ended or stopped without one is refused),
    or None at the deadline."""
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
        time.sleep(BEAT_S / 2)
    return None


def _report(run_dir: str, answers: dict[int, Answer], out) -> int:
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.reading.errors import TraceError
    from phaseprof.plugin.spans import analyze_file

    files = {f.name: f for r in discover(run_dir) for f in r.files}
    failed = 0
    for rank, answer in sorted(answers.items()):
        if answer.state != WRITTEN:
            print(f"rank {rank}: refused: {answer.reason}", file=out)
            failed += 1
            continue
        note = f" ({answer.reason})" if answer.reason else ""
        print(f"rank {rank}: steps {answer.first}–{answer.last}{note}", file=out)
        for name in answer.files:
            f = files.get(name)
            try:
                if f is None:
                    raise TraceError("not found beside the run")
                steps = analyze_file(f).steps  # the analysis the job started, else made now
                print(f"  {name}: {len(steps)} steps analysed", file=out)
            except TraceError as e:
                print(f"  {name}: cannot be read: {e.reason}", file=out)
                failed += 1
    return 1 if failed else 0
