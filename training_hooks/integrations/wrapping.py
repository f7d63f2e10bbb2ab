"""How methods are put in a phase (the hooks' and the framework callbacks'): a wrapper that opens the
phase around a call, and a patch that puts the wrapper in place and can be undone when training
ends (leaving alone a method wrapped again on top of ours)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..tracker import PhaseTracker


def in_phase(tracker: PhaseTracker, phase: str, function: Any, only: Any = None) -> Any:
    """``function`` run inside ``phase`` (the phases it opens itself nest inside it); with ``only``,
    only calls whose first argument is ``only`` (a method patched on a class, for one instance)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        opened = (only is None or args[0] is only) and tracker.begin(phase)
        try:
            return function(*args, **kwargs)
        finally:
            tracker.end(phase, opened)

    return functools.update_wrapper(wrapped, function)


def patch(owner: Any, name: str, replacement: Any) -> Callable[[], None]:
    """Set ``owner.name`` to ``replacement``; returns what undoes it."""
    had_own, previous = name in vars(owner), vars(owner).get(name)
    setattr(owner, name, replacement)

    def undo() -> None:
        if vars(owner).get(name) is not replacement:
            return  # wrapped again on top of ours: ours passes through
        if had_own:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)

    return undo
