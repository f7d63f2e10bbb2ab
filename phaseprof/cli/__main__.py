"""``python -m phaseprof.cli``: the ``phaseprof`` command."""

from phaseprof.cli import main

raise SystemExit(main())
