"""`python -m mlamem.engines REQUEST.json RESULT.json`: one case in its own process."""

import sys

from mlamem.engines.worker import main

sys.exit(main(sys.argv[1:]))
