"""Shared fixtures: the real traces beside the project, and helpers to write hand-built ones."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces`` (real GPU and CPU traces); tests that need it skip where it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


def write_trace(path: os.PathLike, events: list[dict], **top) -> Path:
    """Write a Kineto-style trace (object with ``traceEvents``) to ``path`` (gzipped if it ends .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path
