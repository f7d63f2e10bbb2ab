"""Malformed events, counted by reason: what the report says about a file it could read only in part."""

from __future__ import annotations

from .trace_fields import Event


class Problems:
    """Counts events skipped (or read without a field) by reason, and names the first one."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}
        self.degraded: dict[str, int] = {}
        self.first: tuple[int, str] | None = None  # (index in the file, description)
        self.events: list[Event] | None = None  # the decoded events, to find an event's index
        self.positions: list[int] | None = None  # file index of each decoded event (lenient pass)

    def skip(self, index: int, name: str, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1
        self._note(index, name, what)

    def degrade(self, index: int, name: str, what: str) -> None:
        self.degraded[what] = self.degraded.get(what, 0) + 1
        self._note(index, name, what)

    def add(self, bad: list[Event], what: str) -> None:
        """Decoded events ``bad`` are skipped because of ``what``."""
        if bad:
            self.skipped[what] = self.skipped.get(what, 0) + len(bad)
            self._note_event(bad[0], what)

    def degrade_events(self, bad: list[Event], what: str) -> None:
        if bad:
            self.degraded[what] = self.degraded.get(what, 0) + len(bad)
            self._note_event(bad[0], what)

    def _note_event(self, e: Event, what: str) -> None:
        if self.first is not None:
            return
        index = next((i for i, x in enumerate(self.events or ()) if x is e), -1)
        if index >= 0 and self.positions is not None:
            index = self.positions[index]
        label = f"{quoted(e.ph)} {quoted(e.name)}" if e.name else quoted(e.ph)
        self._set(index, f"event {index} ({label})")

    def _note(self, index: int, name: str, what: str) -> None:
        self._set(index, f"event {index}{f' ({quoted(name)})' if name else ''}")

    def _set(self, index: int, text: str) -> None:
        if self.first is None:
            self.first = (index, text)

    def merge(self, other: Problems) -> None:
        for mine, theirs in ((self.skipped, other.skipped), (self.degraded, other.degraded)):
            for what, n in theirs.items():
                mine[what] = mine.get(what, 0) + n
        if self.first is None:
            self.first = other.first

    @property
    def count(self) -> int:
        return sum(self.skipped.values()) + sum(self.degraded.values())

    def describe(self) -> str:
        """One line: ``3 events skipped: dur is not a number; first: event 5 (X 'aten::mm') …``."""
        parts = []
        for verb, table in (("skipped", self.skipped), ("read without a field", self.degraded)):
            if table:
                n = sum(table.values())
                reasons = ", ".join(what if len(table) == 1 else f"{what} ({k})" for what, k in table.items())
                parts.append(f"{n} event{'s' if n > 1 else ''} {verb}: {reasons}")
        if parts and self.first is not None:
            parts.append(f"first: {self.first[1]}")
        return "; ".join(parts)


def quoted(text: str, limit: int = 60) -> str:
    """A name from the file, quoted on one line (control characters escaped) and cut short."""
    return repr(text if len(text) <= limit else text[:limit] + "…")

