"""A real TensorBoard on real traces, and a real headless Chromium to look at the Step Phases tab.

The logdir holds: the demo's runs (``phaseprof demo``), from tests/data a real V100 trace (``gpu``),
a real two-rank job (``ranks``) and a real run that ended inside the profiled window
(``early_exit``), a run of per-step timings only (``growing``), and crafted traces: one with an
outlier step (``outlier``), one whose op, phase and worker names are HTML (``xss``), a two-rank job
whose straggler is known (``straggler``), a run whose profiled window holds an evaluation pass and
a paused block (``evaluation``, with its scalars).

Chromium and playwright are part of the test setup (the README's test command installs both):
where either is missing these tests fail and say how to install it, rather than skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.logdir import evaluation_run, settled, two_rank_job, write_scalars, write_trace
from tests.tensorboard_server import loaded
from tests.tracebuilder import annotation, op, step, thread_names

from .tab import Tab

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"

#: Names a trace could carry that a careless UI would run as HTML.
XSS_OP = "<img src=x onerror=alert(1)>"
XSS_PHASE = "<img src=y onerror=alert(2)>"
XSS_WORKER = "<svg onload=alert(3)>"


# Module-scoped: the browser, TensorBoard and their threads are gone before other test modules run
# (some of them fork, which is only safe in a process without other threads).
@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: install it (apt-get install chromium), or leave the browser "
                    "tests out with -m 'not browser'", pytrace=False)
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'", pytrace=False)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def _demo_runs(root: Path) -> None:
    """``phaseprof demo`` into ``root/demo``: its training and inference runs, traces and scalars."""
    subprocess.run([sys.executable, "-m", "phaseprof.cli", "demo", "--logdir", str(root / "demo"),
                    "--device", "cpu"], check=True, timeout=600, capture_output=True)


def _xss_run(root: Path) -> None:
    events = thread_names()
    for n in (1, 2):
        t = n * 10_000
        events += [
            step(n, t, 9_000),
            annotation("phaseprof::forward", t + 100, 4_000),
            op(XSS_OP, t + 200, 3_000 + 500 * n),
            annotation("phaseprof::" + XSS_PHASE, t + 5_000, 3_000),
            op("aten::mm", t + 5_100, 1_000),
        ]
    write_trace(root / "xss" / f"{XSS_WORKER}.1.pt.trace.json", events)


def _outlier_run(root: Path) -> None:
    """Five steps (the fewest judged against their noise), the last three times as long as the others."""
    events = thread_names()
    for n, dur in enumerate((1_000, 1_100, 1_050, 1_020, 3_300), start=1):
        t = n * 10_000
        events += [step(n, t, dur), annotation("phaseprof::forward", t + 50, dur - 100),
                   op("aten::mm", t + 60, dur - 200)]
    write_trace(root / "outlier" / "w.1.pt.trace.json", events)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    _demo_runs(root)
    _outlier_run(root)
    for run, source in {"gpu": ("gpu", "hta_ns_resolution"), "ranks": ("gpu", "hta_sampled_2rank"),
                        "early_exit": ("cpu", "early_exit")}.items():
        (root / run).mkdir()
        for f in traces.files(*source):
            shutil.copy(f, root / run / f.name)
    _xss_run(root)
    two_rank_job(root / "straggler", collectives=True)  # rank 1 loads data 50% longer: the others wait
    evaluation_run(root / "evaluation")
    write_scalars(root / "growing", range(10))  # timings only, more steps written during a test
    for rank in (0, 1):  # the per-step scalars each rank of the "ranks" job writes
        write_scalars(root / "ranks" / f"rank{rank}", range(20))
    for f in root.rglob("*"):
        settled(f)
    return root


@pytest.fixture(scope="module")
def tensorboard(logdir):
    with loaded(logdir) as tb:
        yield tb


@contextlib.contextmanager
def open_tab(browser, tensorboard, request, **context_options) -> Iterator[Tab]:
    """A fresh page on TensorBoard in a browser context of its own (``context_options``); after the
    test, no console error and no request off the origin."""
    context = browser.new_context(**context_options)
    t = Tab(context.new_page(), tensorboard, ARTIFACTS, request.node.name)
    try:
        yield t
    finally:
        context.close()
    t.check_clean()


@pytest.fixture
def tab(browser, tensorboard, request):
    """A fresh page on the test's TensorBoard; a test module's ``TAB_OPTIONS`` (browser-context
    options) replace the default viewport."""
    options = getattr(request.module, "TAB_OPTIONS", {"viewport": {"width": 1400, "height": 1800}})
    with open_tab(browser, tensorboard, request, **options) as t:
        yield t
