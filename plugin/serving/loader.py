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
        parser.add_argument(
            "--phaseprof_allowed_hosts", default="", metavar="NAME[:PORT],...",
            help="phaseprof: host names, besides localhost, IP addresses and the --host "
                 "TensorBoard serves on, by which the Step Phases tab may ask a running job for a "
                 "trace (e.g. a reverse proxy's name)")

    def fix_flags(self, flags):
        from .origin import allowed_hosts  # light: the standard library only

        try:
            allowed_hosts(getattr(flags, "phaseprof_allowed_hosts", ""))
        except ValueError as e:
            raise base_plugin.FlagsError(f"--phaseprof_allowed_hosts: {e}") from None

    def load(self, context):
        from .plugin import PhaseprofPlugin

        return PhaseprofPlugin(context)
