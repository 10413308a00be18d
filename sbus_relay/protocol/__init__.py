"""The sbus protocol, sans I/O: bytes in, decisions out.

What it owns: nothing but this map of the protocol's modules.  What it may
touch: nothing.

Nothing here imports ``socket`` or ``gevent``.  ``codec`` turns packets into
events and back (and packs batches); ``frames`` parses what the read loop
meets on every message (a MSG's key, a packed batch's packets); ``session``
holds a connection's protocol state and decides what each packet does to it
(``Session`` for the bus's side of a client, ``LinkSession`` for a relay's
side of its upstream link); ``scan`` finds bytes in a packet; ``keys`` holds
the credential and reserved-``!`` rules; ``index`` finds the recipients of a
key; ``interest`` computes what relays must be told; ``flood`` makes every
flood-control decision and holds a client's outbound queue; ``quota`` every
per-user and per-client limit decision; ``episodes`` the rate-limited
warnings; ``accounting`` the bounded per-relay and per-user rows; ``stats``
holds plain counters; ``limits`` every bound and ``errors`` the one exception
tree.  Tested with tables and hypothesis, without a server.
"""
