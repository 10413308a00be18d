"""Running a bus: config files, addresses, daemonising, logging, metrics, supervision.

Built on ``protocol`` only; the gevent bus (``sbus_relay.bus``) uses these
modules, never the other way round.
"""
