"""``python -m harness``: the same entry as the ``vmfuzz`` script."""

import sys

from harness.cli import main

sys.exit(main())
