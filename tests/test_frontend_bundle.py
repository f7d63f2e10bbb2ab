"""The committed bundle (plugin/static/) is exactly what `npm ci && npm run build` makes of frontend/.

The tab ships prebuilt so that `pip install` needs no Node.js; this test is what keeps the shipped
files and their source in step. It rebuilds from a copy of frontend/ into a temporary folder (the
committed files are never touched) and compares byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT

FRONTEND = ROOT / "frontend"
STATIC = ROOT / "plugin" / "static"

pytestmark = pytest.mark.slow


def test_committed_bundle_is_the_build_of_the_frontend_source(tmp_path):
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: cannot rebuild the frontend to check plugin/static (install Node.js 18+ "
                    "with npm)", pytrace=False)
    work = tmp_path / "frontend"
    shutil.copytree(FRONTEND, work, ignore=shutil.ignore_patterns("node_modules"))
    out = tmp_path / "static"
    for command in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "build", "--", "--outdir", str(out)]):
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(command[1:])} failed:\n{done.stdout}\n{done.stderr}"
    built = sorted(p.name for p in out.iterdir())
    assert built == sorted(p.name for p in STATIC.iterdir()), "plugin/static holds other files than the build makes"
    stale = [name for name in built if (out / name).read_bytes() != (STATIC / name).read_bytes()]
    assert not stale, (f"plugin/static is not the build of frontend/: {stale} differ; "
                       "run `cd frontend && npm ci && npm run build`")
