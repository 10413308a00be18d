"""sbus_relay: a local sbus message bus on gevent, with slave relays.

The protocol is ``shared/sbus-README.txt`` as settled by ``shared/SPEC.md``.
Sans-I/O modules (no socket, no gevent): ``codec``, ``keys``, ``index``,
``interest``, ``outbound``.  I/O modules: ``server``, ``connection``,
``upstream``, ``addresses``, ``client``.  Only ``cli`` reads argv or
configures logging.
"""

__version__ = "0.1.0"
