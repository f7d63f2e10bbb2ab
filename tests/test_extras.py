"""Every extra installs together. pip resolves torch and all of phaseprof's extras at once, from
setup.py as it is, without installing anything (``--dry-run``), in this environment: what the
README's test command installed (its ``.[test]`` holds every store's client) is taken as it is, and
what no extra of it holds (torch-tb-profiler) is resolved from the package index.

It fails on a conflict (pip's ResolutionImpossible), and on the slow way to an answer that the
store clients' pins exist to avoid: pip rejecting candidates of a store's client one after another
(its "looking at multiple versions of boto3" line; unpinned, that took minutes on a fresh venv).
The fresh-venv resolution as a user runs it (torch first, then every extra) is timed by
benchmarks/extras_resolve.py: minutes, too long for the suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The store clients and what pins them to one another: none may need a second candidate.
PINNED = {"fsspec", "s3fs", "aiobotocore", "botocore", "boto3", "s3transfer", "gcsfs", "adlfs",
          "moto", "gcp-storage-emulator"}


def extras() -> dict[str, list[str]]:
    """setup.py's extras, read from setup.py itself (an installed copy's metadata may be older)."""
    from distutils.core import run_setup

    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        return run_setup(str(ROOT / "setup.py"), stop_after="init").extras_require
    finally:
        os.chdir(cwd)


def resolve(*options: str, report: Path) -> subprocess.CompletedProcess:
    """``pip install --dry-run`` of torch and every extra, its report written to ``report``."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", *options, "--report", str(report),
         "torch==2.13.0", "-e", f".[{','.join(sorted(extras()))}]"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def backtracked(said: str) -> set[str]:
    """The packages pip tried more than one version of, from its own lines saying so."""
    return set(re.findall(r"pip is (?:still )?looking at multiple versions of (\S+)", said))


def test_every_extra_resolves_with_torch_and_the_store_clients_need_no_second_try(tmp_path):
    report = tmp_path / "report.json"
    out = resolve(report=report)
    assert out.returncode == 0, out.stderr[-4000:]
    assert not backtracked(out.stdout + out.stderr) & PINNED, out.stdout[-4000:]
    chosen = {item["metadata"]["name"].lower().replace("_", "-")
              for item in json.loads(report.read_text())["install"]}
    assert "phaseprof" in chosen
    # every store client is what the test extra installed: resolving all extras changed none of them
    assert not chosen & PINNED, sorted(chosen & PINNED)
