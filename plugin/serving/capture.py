"""The ``/capture`` route's work: read a run's capture folder, and (POST) write a request into it.

This is the one place the plugin writes: a request file (`phaseprof.capture_channel`), named by the
plugin (``request.<16 hex digits>.json``), a few hundred bytes (its fields are the plugin's own:
a step count it checked, the start step it computed), into ``<run>/.phaseprof/capture/`` only when
that folder exists already (a running PhaseProfiler made it), lies inside the logdir, and is reached
from the run without following a link (`phaseprof.capture_channel.channel_folder`) — for a logdir
in a store, as an object under the run's prefix (`phaseprof.capture_store`) — and only for a
POST sent to TensorBoard's own address from its own origin (`origin.Served`, checked by the route).
Nothing a channel file holds makes it fail: a file out of bounds is ignored, and a run that cannot
be asked is a refusal with the reason. ``--phaseprof_read_only`` (or ``PHASEPROF_READ_ONLY=1``)
turns it off. See docs/security.md.
"""

from __future__ import annotations

import os
import time

from tensorboard import errors

from phaseprof.capture_channel import (
    BY_TAB,
    capture_dir,
    plan_request,
    read_channel,
    write_request,
)

from ..analysis.captures import captures
from ..answers import CaptureAnswer
from ..cache import READ_ONLY_ENV  # the tab read-only, as --phaseprof_read_only makes it
from ..reading import storage
from ..reading.discovery import Run, within

#: The header a POST must carry: a page of another origin cannot send it without the browser asking
#: TensorBoard first (a CORS preflight, which TensorBoard does not grant).
ASK_HEADER = "X-Phaseprof-Capture"


def read_only(flags) -> str | None:
    """Why this TensorBoard may not ask for captures, if it may not."""
    if getattr(flags, "phaseprof_read_only", False):
        return "TensorBoard runs with --phaseprof_read_only: ask with `phaseprof capture` instead"
    if os.environ.get(READ_ONLY_ENV, "") not in ("", "0"):
        return f"TensorBoard runs with {READ_ONLY_ENV} set: ask with `phaseprof capture` instead"
    return None


def capture_impl(logdir: str, run: Run, *, ask: bool, steps: int | None, locked: str | None) -> CaptureAnswer:
    """The run's captures; with ``ask``, after writing a request for the next ``steps`` steps."""
    asked = None
    if ask:
        if locked:
            raise errors.PermissionDeniedError(locked)
        folder = capture_dir(run.path)  # (a store's run lies in the logdir: its listing's keys do)
        if not storage.is_remote(logdir) and not within(logdir, folder):
            raise errors.PermissionDeniedError(f"run {run.name!r}: its capture folder lies outside the logdir")
        try:
            request = plan_request(run.path, steps, by=BY_TAB)
            write_request(run.path, request)
            asked = request.id
        except ValueError as e:
            answer = captures(run.name, read_channel(run.path), time.time(), locked)
            answer.can_ask, answer.reason = False, str(e)
            return answer
        except OSError as e:
            raise errors.PermissionDeniedError(f"run {run.name!r}: the request cannot be written: {e}") from None
    return captures(run.name, read_channel(run.path), time.time(), locked, asked)
