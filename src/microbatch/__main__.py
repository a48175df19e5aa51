"""``python -m microbatch``: the command line."""

from .cli import main

raise SystemExit(main())
