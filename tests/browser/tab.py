"""Driving the Step Phases tab inside TensorBoard, and the tab's number formats (frontend/src/format.ts)."""

from __future__ import annotations

import json
import urllib.parse
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path


def fixed(value: float, digits: int) -> str:
    """JavaScript's ``value.toFixed(digits)``: the exact binary value, ties away from zero."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def ms(value: float | None) -> str:
    return "–" if value is None else fixed(value, 3)


def signed_ms(value: float) -> str:
    return ("+" if value > 0 else "") + fixed(value, 3)


def pct(share: float) -> str:
    return fixed(share * 100, 1) + "%"


def change(a: float, b: float) -> str:
    if a == 0:
        return "–"
    rel = (b - a) / a * 100
    return ("+" if rel > 0 else "") + fixed(rel, 1) + "%"


def count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else fixed(value, 2)


def size(value: int | None, signed: bool = False) -> str:
    """``bytes()`` of format.ts: binary units, one decimal above bytes."""
    if value is None:
        return "–"
    v, unit = abs(value), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while v >= 1024 and unit < len(units) - 1:
        v /= 1024
        unit += 1
    sign = "-" if value < 0 else "+" if signed and value > 0 else ""
    return f"{sign}{fixed(v, 0 if unit == 0 else 1)} {units[unit]}"


class Tab:
    """One browser page on TensorBoard, showing the Step Phases tab."""

    def __init__(self, page, tensorboard, artifacts: Path, test_name: str):
        self.page = page
        self.tb = tensorboard
        self.artifacts = artifacts
        self.test_name = test_name
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self.dialogs: list[str] = []
        self.expected_errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        page.on("pageerror", lambda e: self.console_errors.append(f"uncaught: {e}"))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    # --- opening and waiting ----------------------------------------------------------------------

    def open(self, dark: bool = False, **selections) -> None:
        """TensorBoard with the tab open on ``selections`` (view, run, worker, step, a_run, ...)."""
        pieces = ["phaseprof"] + [f"p.phaseprof.{k}={urllib.parse.quote(str(v), safe='')}"
                                  for k, v in selections.items()]
        self.page.goto(self.tb.url + ("?darkMode=true" if dark else "") + "#" + "&".join(pieces))
        self.settle()

    @property
    def frame(self):
        return self.page.frame_locator("iframe[src*='plugin_entry.html?name=phaseprof']")

    def settle(self, timeout: float = 30_000) -> None:
        """Wait until the pane shows a drawn view: no loading line left, something in its place."""
        self.frame.locator(".pane .view > *").first.wait_for(timeout=timeout)
        frame = next(f for f in self.page.frames if "plugin_entry.html" in f.url)
        frame.wait_for_function("() => !document.querySelector('.pane .loading')", timeout=timeout)

    def text(self, selector: str = ".pane") -> str:
        return self.frame.locator(selector).first.inner_text()

    def figure(self, label: str) -> str:
        """The value of the headline figure labelled ``label``."""
        figure = self.frame.locator(".figure", has=self.frame.locator(".figure-label", has_text=label)).first
        return figure.locator(".figure-value").inner_text()

    def card(self, title: str):
        return self.frame.locator(".card", has=self.frame.locator("h3", has_text=title)).first

    def rows(self, card_title: str) -> list[list[str]]:
        """The cells of the first table in the card titled ``card_title``, row by row."""
        rows = self.card(card_title).locator("table").first.locator("tbody tr")
        return [[cell.strip() for cell in row.split("\t")] for row in rows.all_inner_texts()]

    def selections(self) -> dict[str, str]:
        """The tab's selections, read back from TensorBoard's URL hash."""
        fragment = urllib.parse.urlsplit(self.page.url).fragment
        pairs = [p.split("=", 1) for p in fragment.split("&") if "=" in p]
        return {urllib.parse.unquote(k)[len("p.phaseprof."):]: urllib.parse.unquote(v)
                for k, v in pairs if urllib.parse.unquote(k).startswith("p.phaseprof.")}

    # --- the same data the tab shows, from the same server -----------------------------------------

    def api(self, route: str, **params) -> dict:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self.tb.json(f"/data/plugin/phaseprof/{route}" + (f"?{query}" if query else ""))

    # --- charts -----------------------------------------------------------------------------------

    def chart_box(self, selector: str) -> dict:
        box = self.frame.locator(selector).first.bounding_box()
        assert box, f"no chart at {selector}"
        return box

    def hover_until(self, selector: str, wanted: str, y_fraction: float = 0.7) -> tuple[float, float]:
        """Move across a chart until its tooltip title reads ``wanted``; where the pointer is then."""
        box = self.chart_box(selector)
        y = box["y"] + box["height"] * y_fraction
        seen = []
        for k in range(1, 80):
            x = box["x"] + box["width"] * k / 80
            self.page.mouse.move(x, y)
            tip = self.frame.locator(f"{selector} .tip-title")
            if tip.count() and tip.first.is_visible():
                title = tip.first.inner_text()
                seen.append(title)
                if title == wanted:
                    return x, y
        raise AssertionError(f"no tooltip {wanted!r} over {selector}; saw {sorted(set(seen))}")

    # --- evidence ---------------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        """The whole TensorBoard page as it looks now, kept under test-artifacts/."""
        self.artifacts.mkdir(exist_ok=True)
        path = self.artifacts / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check_clean(self) -> None:
        origin = self.tb.url.rstrip("/")
        outside = [u for u in self.requests if not (u.startswith(origin + "/") or u.startswith(("data:", "blob:")))]
        assert not outside, f"requests left the origin: {outside}"
        errors = [e for e in self.console_errors if not any(x in e for x in self.expected_errors)]
        assert not errors, f"console errors: {json.dumps(errors, indent=1)}"
        assert not self.dialogs, f"dialogs opened (script ran?): {self.dialogs}"
