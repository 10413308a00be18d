"""Long-run hardening: live fuzzing, fault injection, load and soak (issue 7).

Each module drives real server processes over local Unix sockets and returns a
plain ``dict`` of figures; ``sbus-relay harden`` prints them and
``tests/hardening`` runs the same functions with small parameters.
See docs/reliability.md.
"""
