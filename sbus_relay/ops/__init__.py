"""Running a bus: config files, addresses, daemonising, logging, metrics, supervision.

What it owns: nothing but this map of ops.  What it may touch: nothing.

Built on ``protocol`` only; the gevent bus (``sbus_relay.bus``) uses these
modules, never the other way round.
"""
