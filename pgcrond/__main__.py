"""``python -m pgcrond``: the ``pgcrond`` command."""

import sys

from pgcrond.cli import main

sys.exit(main())
