"""sbus_relay: a local sbus message bus on gevent, with slave relays.

What it owns: the package's version and this map of its layers.  What it may
touch: nothing.

Layers, each importing only those below it:

* ``protocol``: the sans-I/O core (codec, keys, index, interest, flood control);
* ``ops``: config, addresses, daemon, logging, metrics, supervisor;
* ``bus``: the gevent server, its connections and the upstream link;
* ``client``, ``pipeline`` and ``bench``: users of the bus;
* ``cli``: the commands, the only code that reads argv or configures logging.

docs/design.md draws them; docs/protocol.md describes the protocol.
"""

__version__ = "0.1.0"
