"""Long-run hardening: live fuzzing, fault injection, load and soak.

Each module drives real server processes over local Unix sockets and returns a
plain ``dict`` of figures; ``python -m tests.hardening.harness`` prints them,
``tests/hardening/test_runs.py`` runs the same functions with small parameters
and ``test_full_runs.py`` (``-m slow``) with the full ones.  See
docs/reliability.md.
"""
