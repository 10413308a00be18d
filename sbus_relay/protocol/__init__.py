"""The sbus protocol, sans I/O: bytes in, decisions out.

Nothing here imports ``socket`` or ``gevent``.  ``codec`` turns packets into
events, ``keys`` holds the credential and reserved-``!`` rules, ``index``
finds the recipients of a key, ``interest`` computes what relays must be told,
``flood`` makes every flood-control decision, ``stats`` holds plain counters,
``limits`` every bound and ``errors`` the one exception tree.  Tested with
tables and hypothesis, without a server.
"""
