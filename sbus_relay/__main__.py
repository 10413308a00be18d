"""``python -m sbus_relay`` is ``sbus-relay``."""

import sys

from .cli import main

sys.exit(main())
