"""`python -m sessionlog`: the same command line as the `sessionlog` console script."""

from sessionlog.cli import main

raise SystemExit(main())
