"""The bus on gevent: the server, its client connections and the upstream link.

What it owns: nothing but this map of the bus's modules.  What it may touch:
nothing.

``connection`` moves a connection's bytes (its protocol state is a
``protocol.session.Session``) and routes each message (``Router``);
``server`` accepts clients and carries out what their non-MSG packets ask;
``upstream`` is a relay's link to its parent; ``handover`` the live
upgrade's record and orchestration; ``views`` the metrics gauges, per-who
rows and ``/clients``; ``batchio`` many packets per system call.  A
connection, the upstream link, the hand-over and the views each define the
narrow interface they need from the server (``connection.Handler``,
``upstream.UpstreamHost``, ``handover.Bus``, ``views.Shown``, all
``typing.Protocol``); the server implements them and builds the rest, so
every import points down: ``server`` -> ``handover``, ``views`` ->
``upstream`` -> ``connection`` -> ``protocol``.
"""
