"""TensorBoard's loading processes (`plugin/serving/loading.py`)."""

from __future__ import annotations

import subprocess
import sys

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
