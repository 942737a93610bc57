import sys

from pgcrond.cli import main

sys.exit(main())
