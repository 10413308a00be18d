"""A bus's NATS link, as a process of its own (docs/nats.md, "How it is built").

What it owns: everything between the bus's socket pair and NATS: the engine
(``engine``: nats.c, ``natsc``, or nats-py, ``natspy``), the bridge that runs
the process (``bridge``) and its parts, one job each: ``outbound`` (bus ->
NATS), ``inbound`` (NATS -> bus), ``subscriptions``, ``gossip`` (interest),
``confirm`` (what the server confirmed), ``tobus`` (writing to the bus).
What it may touch: ``protocol`` and ``ops``; never ``bus`` (the other
process), which starts it by its command line (``cli/link.py``).
"""
