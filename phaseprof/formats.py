"""The one rule for the formats of files that one version of phaseprof writes and another may read
(the capture channel's files, the analysis entries, the step indexes): each carries its format,
"major.minor". A reader of major version M reads every M.x: a newer minor version only adds fields,
which the reader ignores. Another major version is refused with one line saying which format it is
and which this phaseprof reads; the caller decides what refusal means (a channel file is ignored with
that reason, an entry or an index is not used and the trace is read again).

Torch-free: the training side and the TensorBoard side both import it.
"""

from __future__ import annotations

import logging
import re

#: A format as a file carries it: major and minor version, each at most four digits.
FORMAT_RE = re.compile(r"^(?P<major>\d{1,4})\.(?P<minor>\d{1,4})$")


class OtherFormat(ValueError):
    """A file in a format this phaseprof does not read; the message says which, in one line."""

    def __init__(self, message: str, major: int | None = None) -> None:
        super().__init__(message)
        self.major = major  # the file's major version; None: it names none


def check(found: str, major: int) -> tuple[int, int]:
    """(major, minor) of the format ``found``, when a reader of format ``major``.x reads it; else
    `OtherFormat`, saying whether a newer or an older phaseprof wrote it."""
    m = FORMAT_RE.fullmatch(found)
    if m is None:
        raise OtherFormat(f"its format {found[:20]!r} is not major.minor")
    got = int(m["major"]), int(m["minor"])
    if got[0] != major:
        who = "a newer phaseprof wrote it? upgrade phaseprof" if got[0] > major else "an older phaseprof wrote it"
        raise OtherFormat(f"format {found}: this phaseprof reads format {major}.x ({who})", got[0])
    return got


#: (kind of file, major version) pairs already in the log, once each per process.
_told: set[tuple[str, int | None]] = set()


def tell_once(logger: logging.Logger, what: str, path: str, refusal: OtherFormat) -> None:
    """One line in the log (info: nothing is wrong, the trace is read again) for the first ``what``
    (an analysis entry, a step index) found of each major version this phaseprof does not read (a
    newer version sharing the logdir writes one per trace), and for the first naming none."""
    if (what, refusal.major) not in _told:
        _told.add((what, refusal.major))
        logger.info("phaseprof: %s: %s in %s: not used, the trace is read instead (the same for "
                    "others of that version)", path, what, refusal)
