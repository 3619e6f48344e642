"""`python -m mlamem`."""

from mlamem.entry import main

raise SystemExit(main())
