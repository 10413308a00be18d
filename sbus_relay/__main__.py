"""``python -m sbus_relay`` is ``sbus-relay``."""

import sys

from sbus_relay.cli import main

sys.exit(main())
