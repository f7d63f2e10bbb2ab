"""TensorBoard's entry point for phaseprof (``tensorboard_plugins`` in setup.py).

Kept light on purpose: TensorBoard imports every plugin's entry module at start-up, and an import
error here would stop TensorBoard. The plugin itself (and numpy, msgspec) load in `load()`.
"""

from __future__ import annotations

from tensorboard.plugins import base_plugin


class PhaseprofLoader(base_plugin.TBLoader):
    def define_flags(self, parser):
        parser.add_argument(
            "--phaseprof_read_only", action="store_true",
            help="phaseprof: the Step Phases tab never writes under the logdir (its button that asks a running "
                 "job for a trace of its next steps is off); also PHASEPROF_READ_ONLY=1")

    def load(self, context):
        from .plugin import PhaseprofPlugin

        return PhaseprofPlugin(context)
