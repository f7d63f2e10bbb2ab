"""PhaseProfiler inside training frameworks: one callback each, importing its framework only when
used (``phaseprof.lightning``, ``phaseprof.transformers``). A callback only says where the
framework's phases begin and end; timing, ranges, traces and scalars are PhaseProfiler's."""
