"""``phaseprof cache``: analyse traces now and store each analysis beside its trace, where ``report``,
``compare`` and TensorBoard find it (PhaseProfiler runs it after each trace, at idle priority)."""

from __future__ import annotations

import contextlib
import os
import sys

from phaseprof.cli.terminal import shown


def cache_paths(paths: list[str], *, background: bool = False, compress: bool = False, analysis: bool = True,
                awaited: bool = False) -> int:
    """Analyse every trace under ``paths`` into the cache (``compress``: each is an exported
    ``….pt.trace.json.part`` to gzip into place first); 1 when any could not be, else 0."""
    failed = 0
    if compress:
        from phaseprof.trace_files import compress_into_place

        with contextlib.suppress(AttributeError, OSError):
            os.nice(10)  # below the training loop, yet never starved as at idle priority
        exported_paths, paths = paths, []
        for exported in exported_paths:
            try:
                paths.append(compress_into_place(exported))
            except (OSError, ValueError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                print(f"{shown(exported)}: could not compress: {shown(why)}", file=sys.stderr)
                failed += 1
        if not analysis:
            return 1 if failed else 0
    if background and not awaited:
        _idle_priority()
    elif background and not compress:
        with contextlib.suppress(AttributeError, OSError):
            os.nice(10)
    from phaseprof.plugin.reading import storage
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.reading.errors import TraceError
    from phaseprof.plugin.spans import analyze_file

    for path in paths:
        try:
            found = storage.exists(path)
        except storage.StorageError as e:
            print(shown(str(e)), file=sys.stderr)
            failed += 1
            continue
        if not found:
            print(f"{shown(path)}: no such file or directory", file=sys.stderr)
            failed += 1
            continue
        unreadable: list[tuple[str, str]] = []
        for run in discover(path, unreadable):
            for f in run.files:
                try:
                    analyze_file(f)
                except TraceError as e:
                    print(f"{shown(f.path)}: {shown(e.reason)}", file=sys.stderr)
                    failed += 1
        for directory, why in unreadable:
            print(f"{shown(directory)}: {shown(why)}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _idle_priority() -> None:
    """Run only when nothing else wants the CPU (Linux SCHED_IDLE), else at the lowest niceness."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.nice(19)
