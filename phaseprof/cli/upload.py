"""``phaseprof upload STAGING_DIR URL``: put in the store what a run written to it left staged (the
bucket was missing, writing was denied, or the store was down when the run closed: its summary
printed this command).

The staging folder mirrors the logdir: each file under STAGING_DIR goes to the same path under URL.
Resumable and idempotent: one listing of URL says what is there already (an object at the file's
size counts as uploaded), only what is missing or differs is uploaded, and a second listing confirms
all of it before anything is removed. Then the staging folder goes, but only a folder PhaseProfiler
made (named ``phaseprof-staging-…``, or inside one): any other folder is uploaded and kept.

A trace the job exported but never compressed (``….pt.trace.json.part``: its process was stopped)
is compressed into place first, as the job would have; other unfinished files (``.tmp``, a partial
``.gz.part``) are writes cut short, left out and removed with the folder.

Exit status: 0 when all of it is in the store (and the staging folder removed), 1 when the store did
not take all of it (the folder is kept: run the command again), 2 when an argument is wrong.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys

from phaseprof.contract import TRACE_FILE_RE
from phaseprof.plugin.reading import storage
from phaseprof.trace_files import EXPORTED_SUFFIX, compress_into_place
from phaseprof.training_hooks.upload import STAGING_PREFIX, WHY, Mirror

from .terminal import shown


def upload(staging: str, url: str) -> int:
    """Upload what is under ``staging`` to ``url``, confirm it, remove the staging folder."""
    if not storage.is_remote(url):
        return _fail(f"{url}: not a store's URL (s3://bucket/prefix, gs://…, az://…)", 2)
    if not os.path.isdir(staging) or os.path.islink(staging):
        return _fail(f"{staging}: no such folder", 2)
    try:
        mirror = Mirror(staging, staging, url, lambda line: None)
    except storage.StorageError as e:
        return _fail(str(e), 2)
    partial = _finish_exports(mirror)
    mirror.confirm()  # what is there already counts as uploaded
    uploaded = len(mirror.pending())
    if mirror.refused is not None or not mirror.sync() or not mirror.confirm():
        return _refused(mirror, staging, url)
    files = len(mirror.files())
    said = f"phaseprof upload: {files} file(s) in {url} ({uploaded} uploaded now)"
    if partial:
        said += f"; {partial} unfinished file(s) left out (writes cut short)"
    if _made_by_phaseprof(staging):
        shutil.rmtree(staging)
        _remove_empty_parents(staging)
        said += f"; {staging} removed"
    else:
        said += f"; {staging} kept (not a folder PhaseProfiler staged a run in)"
    print(shown(said))
    return 0


def _finish_exports(mirror: Mirror) -> int:
    """Compress the exported traces left unfinished into place; the count of other unfinished
    files."""
    partial = 0
    for path in mirror.unfinished():
        name = os.path.basename(path)
        trace = name[:-len(EXPORTED_SUFFIX)]
        exported = name.endswith(EXPORTED_SUFFIX) and TRACE_FILE_RE.match(trace)
        try:
            if exported and stat.S_ISREG(os.lstat(path).st_mode):
                compress_into_place(path)
                continue
        except OSError as e:
            print(shown(f"phaseprof upload: {path}: cannot compress it ({e}); left out"),
                  file=sys.stderr)
        partial += 1
    return partial


def _refused(mirror: Mirror, staging: str, url: str) -> int:
    if mirror.refused is None:  # uploaded, yet listed at another size: changed meanwhile?
        why = "the store does not list them at their size"
    else:
        why = f"{WHY[mirror.refused]} ({mirror.error})"
    return _fail(f"{url}: {why}; {mirror.left()} file(s) still in {staging}, kept: "
                 "run the command again once the store takes them", 1)


def _made_by_phaseprof(folder: str) -> bool:
    """Whether ``folder`` is a staging folder PhaseProfiler made, or lies inside one."""
    path = os.path.realpath(folder)
    while os.path.dirname(path) != path:
        if os.path.basename(path).startswith(STAGING_PREFIX):
            return True
        path = os.path.dirname(path)
    return False


def _remove_empty_parents(folder: str) -> None:
    """A run's folder given: the staging folder above it goes too once nothing else is in it."""
    path = os.path.realpath(folder)
    while not os.path.basename(path).startswith(STAGING_PREFIX):
        path = os.path.dirname(path)
        try:
            os.rmdir(path)
        except OSError:
            return


def _fail(line: str, code: int) -> int:
    print(shown(f"phaseprof upload: {line}"), file=sys.stderr)
    return code
