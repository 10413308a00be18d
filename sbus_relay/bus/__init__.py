"""The bus on gevent: the server, its client connections and the upstream link.

A connection and the upstream link each define the narrow interface they need
from the server (``connection.Router``, ``upstream.UpstreamHost``, both
``typing.Protocol``); the server implements both and builds them, so every
import points down: ``server`` -> ``connection``, ``upstream`` -> ``protocol``.
"""
