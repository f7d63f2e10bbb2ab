"""Closing on SIGTERM (`training_hooks/signals.py`) in this process: a real SIGTERM raised to the
test itself, with a Python handler before it, or the default action with ``os.kill`` stood in for
(the default would end the test run). Each test puts the SIGTERM handler it found back."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from phaseprof.training_hooks.signals import CloseOnSigterm


@pytest.fixture(autouse=True)
def sigterm_kept():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


class Previous:
    """A handler installed before phaseprof's (Lightning's, say): records its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.calls.append(signum)


def test_sigterm_closes_the_run_then_calls_the_handler_installed_before():
    previous, closed = Previous(), []
    signal.signal(signal.SIGTERM, previous)
    closer = CloseOnSigterm(lambda: closed.append(signal.getsignal(signal.SIGTERM)))
    assert signal.getsignal(signal.SIGTERM) == closer._handle
    signal.raise_signal(signal.SIGTERM)
    assert closed == [previous]  # the previous handler back before the close runs
    assert previous.calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is previous
    signal.raise_signal(signal.SIGTERM)  # a second one goes to the previous handler alone
    assert closed == [previous] and previous.calls == [signal.SIGTERM] * 2


def test_the_default_action_is_taken_again_after_closing(monkeypatch):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    killed, closed = [], []
    monkeypatch.setattr(os, "kill", lambda pid, signum: killed.append((pid, signum)))
    closer = CloseOnSigterm(lambda: closed.append(True))
    closer._handle(signal.SIGTERM, None)
    assert closed == [True]
    assert killed == [(os.getpid(), signal.SIGTERM)]  # the process ends as it would have
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_signal_is_passed_on_even_when_closing_fails():
    previous = Previous()
    signal.signal(signal.SIGTERM, previous)

    def close() -> None:
        raise OSError("disk full")

    closer = CloseOnSigterm(close)
    with pytest.raises(OSError, match="disk full"):
        closer._handle(signal.SIGTERM, None)
    assert previous.calls == [signal.SIGTERM]


def test_a_forked_child_closes_nothing_and_passes_the_signal_on(monkeypatch):
    previous, closed = Previous(), []
    signal.signal(signal.SIGTERM, previous)
    closer = CloseOnSigterm(lambda: closed.append(True))
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # as seen from a child forked after
    signal.raise_signal(signal.SIGTERM)
    assert closed == [] and previous.calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == closer._handle  # the child's handler is left alone


def test_an_ignored_sigterm_stays_ignored():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    closer = CloseOnSigterm(lambda: None)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    closer.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_handler_set_outside_python_is_left_alone(monkeypatch):
    previous = Previous()
    signal.signal(signal.SIGTERM, previous)
    monkeypatch.setattr(signal, "getsignal", lambda signum: None)  # what Python reports for it
    CloseOnSigterm(lambda: None)
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_nothing_is_installed_from_another_thread():
    previous = Previous()
    signal.signal(signal.SIGTERM, previous)
    made = []
    thread = threading.Thread(target=lambda: made.append(CloseOnSigterm(lambda: None)))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is previous
    made[0].restore()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_restore_puts_the_previous_handler_back_once():
    previous = Previous()
    signal.signal(signal.SIGTERM, previous)
    closer = CloseOnSigterm(lambda: None)
    closer.restore()
    assert signal.getsignal(signal.SIGTERM) is previous
    later = Previous()
    signal.signal(signal.SIGTERM, later)
    closer.restore()  # restored already: the handler installed since stays
    assert signal.getsignal(signal.SIGTERM) is later


def test_restore_leaves_a_handler_installed_on_top_of_its_own():
    previous, later = Previous(), Previous()
    signal.signal(signal.SIGTERM, previous)
    closer = CloseOnSigterm(lambda: None)
    signal.signal(signal.SIGTERM, later)
    closer.restore()
    assert signal.getsignal(signal.SIGTERM) is later


def test_restore_from_another_thread_raises_nothing_and_leaves_the_handler():
    previous, closed = Previous(), []
    signal.signal(signal.SIGTERM, previous)
    closer = CloseOnSigterm(lambda: closed.append(True))
    errors = []

    def restore() -> None:
        try:
            closer.restore()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    thread = threading.Thread(target=restore)
    thread.start()
    thread.join()
    assert errors == []
    assert signal.getsignal(signal.SIGTERM) == closer._handle  # only the main thread may change it
    closer.restore()  # restored once already: not again
    assert signal.getsignal(signal.SIGTERM) == closer._handle
