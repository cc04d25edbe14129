"""`python -m oncelog.cli`: the `oncelog` command."""

from oncelog.cli import main

raise SystemExit(main())
