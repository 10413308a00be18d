"""The bus on gevent: the server, its client connections and the upstream link.

``ports`` defines the narrow interface through which a connection and the
upstream link reach the server; the server implements it, so the lower
modules never import ``server``.
"""
