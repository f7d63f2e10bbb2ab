"""How long pip takes to resolve every extra as a user's fresh install does: a new venv, torch
first (``pip install torch==2.13.0``), then ``pip install --dry-run -e '.[every extra]'`` timed,
with the packages pip tried more than one version of (each a download). Needs the package index.

    python benchmarks/extras_resolve.py [--keep VENV]

Prints the seconds, the load average before and after, and pip's backtracking lines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_extras import backtracked, extras  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="the venv to make (kept); a temporary one by default")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(args.keep or os.path.join(tmp, "venv"))
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        subprocess.run([*pip, "install", "-q", "torch==2.13.0"], check=True)
        load = os.getloadavg()[0]
        start = time.monotonic()
        out = subprocess.run([*pip, "install", "--dry-run", "-e", f".[{','.join(sorted(extras()))}]"],
                             cwd=ROOT, capture_output=True, text=True)
        took = time.monotonic() - start
    print(f"resolved: {out.returncode == 0} in {took:.0f} s (load {load:.1f} -> {os.getloadavg()[0]:.1f})")
    print("pip tried several versions of:", sorted(backtracked(out.stdout + out.stderr)) or "none")
    if out.returncode:
        print(out.stderr[-4000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
