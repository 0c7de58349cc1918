"""``python -m vmfuzz``: the same entry as the ``vmfuzz`` script."""

import sys

from vmfuzz.harness.cli import main

sys.exit(main())
