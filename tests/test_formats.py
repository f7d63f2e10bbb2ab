"""The one rule for formats another version may read (`phaseprof/formats.py`): every minor version
of the reader's major one is read, another major version is refused in one line saying which."""

from __future__ import annotations

import logging

import pytest

from phaseprof import formats


@pytest.mark.parametrize("found", ["1.0", "1.1", "1.9999"])
def test_every_minor_version_of_the_major_one_is_read(found):
    assert formats.check(found, 1) == (1, int(found.split(".")[1]))


@pytest.mark.parametrize(("found", "says"), [
    ("2.0", "format 2.0: this phaseprof reads format 1.x (a newer phaseprof wrote it? upgrade phaseprof)"),
    ("0.3", "format 0.3: this phaseprof reads format 1.x (an older phaseprof wrote it)"),
    ("1", "its format '1' is not major.minor"),
    ("1.0\n2.0", "its format '1.0\\n2.0' is not major.minor"),
    ("1.0\n", "its format '1.0\\n' is not major.minor"),
    ("9" * 30, "its format '99999999999999999999' is not major.minor"),
])
def test_another_major_version_or_no_version_at_all_is_refused_in_one_line(found, says):
    with pytest.raises(formats.OtherFormat) as refused:
        formats.check(found, 1)
    assert str(refused.value) == says


def test_the_log_names_each_kind_of_file_and_major_version_once(monkeypatch, caplog):
    monkeypatch.setattr(formats, "_told", set())
    logger = logging.getLogger("phaseprof.test")
    refusals = [formats.OtherFormat(f"format {v}: …", int(v[0])) for v in ("2.0", "2.1", "3.0")]
    refusals += [formats.OtherFormat(f"its format {x!r} is not major.minor") for x in "xy"]
    with caplog.at_level("INFO", logger="phaseprof.test"):
        for path in ("a", "b"):
            for refusal in refusals:
                for what in ("an analysis entry", "a step index"):
                    formats.tell_once(logger, what, path, refusal)
    assert len(caplog.records) == 6  # 2.x, 3.x and "no format", for each kind of file
    assert all(r.getMessage().startswith("phaseprof: a: ") for r in caplog.records)
