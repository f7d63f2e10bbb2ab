"""What the profiler could not do (`training_hooks/faults.py`): one warning for the run, each cause
once in the summary with how often it happened."""

from __future__ import annotations

import errno
import os
import warnings

import pytest

from phaseprof.training_hooks.faults import Faults


def disk_full(name: str) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", name)


def test_the_first_fault_is_the_run_s_one_warning_and_each_cause_one_line_with_its_count():
    faults = Faults("logs/run")
    with pytest.warns(RuntimeWarning) as caught:
        line = faults.report("could not write traces", disk_full("a.json"))
    assert line == "could not write traces: OSError: [Errno 28] No space left on device: 'a.json'"
    (warning,) = caught
    assert str(warning.message) == (
        f"phaseprof (logs/run): {line}. Training goes on; further problems are "
        "listed in the summary printed by close()."
    )
    # pointed at the caller of report, not at faults.py (mutmut puts a frame of its own
    # between them)
    assert os.path.basename(warning.filename) != "faults.py"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, whatever the cause
        # the same errno with another file name: the same cause, its first words kept
        assert faults.report("could not write traces", disk_full("b.json")) == line
        assert faults.report("could not write traces", disk_full("c.json")) == line
        other = faults.report(
            "could not write traces", PermissionError(errno.EACCES, "Permission denied")
        )
        hook = faults.report("module ranges failed", ValueError("bad shape"))
        assert faults.report("module ranges failed", ValueError("bad shape")) == hook
        assert (
            faults.report("module ranges failed", ValueError("other shape")) != hook
        )  # no errno: the message
    assert other == "could not write traces: PermissionError: [Errno 13] Permission denied"
    assert faults.summary() == [
        f"{line} (3 times)",
        other,
        "module ranges failed: ValueError: bad shape (2 times)",
        "module ranges failed: ValueError: other shape",
    ]
    assert faults.lines == [line, other, hook, "module ranges failed: ValueError: other shape"]


def test_a_cause_reported_without_warning_leaves_the_warning_to_the_next():
    faults = Faults("run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = faults.report("upload down", ConnectionError("refused"), warn=False)
        assert (
            faults.report("upload down", ConnectionError("refused"), warn=True) == quiet
        )  # known: no warning
    with pytest.warns(RuntimeWarning, match="could not write traces"):
        faults.report("could not write traces", disk_full("a"))
    assert faults.summary() == [
        "upload down: ConnectionError: refused (2 times)",
        "could not write traces: OSError: [Errno 28] No space left on device: 'a'",
    ]


def test_a_withdrawn_cause_leaves_the_summary_and_comes_back_as_a_new_line():
    faults = Faults("run")
    with pytest.warns(RuntimeWarning):
        down = faults.report("upload down", ConnectionError("refused"))
    faults.report("upload down", ConnectionError("refused"))
    kept = faults.report("could not write traces", disk_full("a"))
    faults.withdraw(down)
    faults.withdraw("never reported")  # nothing to take out
    assert faults.summary() == [kept]
    assert faults.report("upload down", ConnectionError("refused")) == down
    assert faults.summary() == [kept, down]  # counted from 1 again, at the end
    faults.report("could not write traces", disk_full("b"))
    assert faults.summary() == [f"{kept} (2 times)", down]


def test_errors_of_two_kinds_in_the_same_words_are_two_causes():
    faults = Faults("run")
    with pytest.warns(RuntimeWarning):
        faults.report("module ranges failed", ValueError("bad input"))
    faults.report("module ranges failed", TypeError("bad input"))
    faults.report("module ranges failed", TypeError("bad input"))
    assert faults.summary() == [
        "module ranges failed: ValueError: bad input",
        "module ranges failed: TypeError: bad input (2 times)",
    ]
