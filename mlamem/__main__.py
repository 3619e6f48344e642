"""`python -m mlamem`."""

from mlamem.cli import main

raise SystemExit(main())
