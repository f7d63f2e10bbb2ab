"""TensorBoard's entry point for phaseprof (``tensorboard_plugins`` in setup.py).

Kept light on purpose: TensorBoard imports every plugin's entry module at start-up, and an import
error here would stop TensorBoard. The plugin itself (and numpy, msgspec) load in `load()`.
"""

from __future__ import annotations

from tensorboard.plugins import base_plugin


class PhaseprofLoader(base_plugin.TBLoader):
    def load(self, context):
        from .plugin import PhaseprofPlugin

        return PhaseprofPlugin(context)
