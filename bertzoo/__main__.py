"""`python -m bertzoo ...`: the same as the `bertzoo` command."""

import sys

from bertzoo.cli import main

sys.exit(main())
