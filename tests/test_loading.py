"""TensorBoard's loading processes (`plugin/serving/loading.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from phaseprof.plugin.serving.loading import LoaderPool

_MAIN = """
import os, sys, threading

if __name__ == "__mp_main__":  # imported again by a spawned process
    open(sys.argv[1], "w").write("imported")

if __name__ == "__main__":
    from phaseprof.plugin.serving.loading import LoaderPool

    done, out = threading.Event(), []
    pool = LoaderPool(lambda key, state, result: (out.append((state, result)), done.set()), 1,
                      target=os.path.basename)
    pool.submit("k", "/logdir/run/w.1.pt.trace.json")
    assert done.wait(300), "no answer from the loading process"
    pool.close()
    print(out)
"""


def test_a_loading_process_does_not_import_the_main_module_again(tmp_path):
    # TensorBoard's main module is `tensorboard.main`: half a second of imports per loading process.
    script, marker = tmp_path / "main.py", tmp_path / "imported"
    script.write_text(_MAIN)
    done = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('ready', 'w.1.pt.trace.json')]"
    assert not marker.exists()


def _flag_once_released(item: tuple[str, bool]) -> bool:
    """A loading target that holds its process until the file ``<path>.go`` exists, then answers
    whether other files waited for a loader when it was handed its own."""
    path, others_waiting = item
    deadline = time.monotonic() + 300
    while not os.path.exists(path + ".go") and time.monotonic() < deadline:
        time.sleep(0.01)
    return others_waiting


def test_a_loader_is_told_whether_other_files_wait_for_it(tmp_path):
    # the step index is left out of a small trace loaded while others wait (`loading.load`)
    out: dict[str, tuple[str, bool]] = {}
    done = threading.Event()

    def record(key, state, result):
        out[key] = (state, result)
        if len(out) == 3:
            done.set()

    held = str(tmp_path / "held")
    pool = LoaderPool(record, 1, target=_flag_once_released, backlog=True)
    try:
        pool.submit("held", held)  # holds the only process until released
        pool.submit("second", str(tmp_path / "second"))
        pool.submit("last", str(tmp_path / "last"))
        for name in ("second", "last"):
            open(tmp_path / f"{name}.go", "w").close()
        open(held + ".go", "w").close()
        assert done.wait(300), out
    finally:
        pool.close()
    assert out["second"] == ("ready", True)  # handed out while "last" still waited
    assert out["last"] == ("ready", False)
