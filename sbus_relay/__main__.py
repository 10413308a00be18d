"""``python -m sbus_relay`` is ``sbus-relay``.

What it owns: nothing; it runs ``cli.main``.  What it may touch: the CLI.
"""

import sys

from sbus_relay.cli import main

sys.exit(main())
