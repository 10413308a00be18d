"""A bus client driven over stdin/stdout, run inside a namespace by the tests.

The tests start it with ``nsenter`` into a "container" (helpers.py), so that
the client library runs where a containerised program would: its pid is the
namespace's, its socket path the container's.  One JSON object per line in,
one per line out::

    python agent.py ADDRESS [UID GID]      # prints {"pid": <os.getpid()>, ...}
    {"op": "whoami"}                       -> {"ok": true, "value": "!/cred/..."}
    {"op": "sub", "pattern": "demo/"}      -> {"ok": true}   (after a whoami round trip)
    {"op": "pub", "key": "k", "payload": "p"}
    {"op": "recv", "timeout": 5}           -> {"ok": true, "control": false,
                                               "key": "..", "payload": ".."}
                                              | {"timeout": true}
    {"op": "close"}                        -> exits

A closed connection answers ``{"closed": "<the bus's reason>"}``.  Keys and
payloads travel as latin-1 text, so any byte survives.  With UID and GID it
drops root after importing the library and before connecting: the kernel takes
the peer's credentials at connect time, so the bus sees that user.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from sbus_relay.client import Client
from sbus_relay.protocol.errors import BusClosed, SbusError


def _text(data: bytes) -> str:
    return data.decode("latin-1")


def _bytes(text: str) -> bytes:
    return text.encode("latin-1")


def _handle(bus: Client, request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "whoami":
        return {"ok": True, "value": bus.whoami()}
    if op == "sub":
        bus.subscribe(_bytes(request["pattern"]))
        bus.whoami()  # the bus handles our packets in order: the SUB took effect
        return {"ok": True}
    if op == "unsub":
        bus.unsubscribe(_bytes(request["pattern"]))
        bus.whoami()
        return {"ok": True}
    if op == "pub":
        bus.publish(_bytes(request["key"]), _bytes(request.get("payload", "")))
        return {"ok": True}
    if op == "recv":
        try:
            message = bus.receive(float(request.get("timeout", 5)))
        except TimeoutError:
            return {"timeout": True}
        return {
            "ok": True,
            "control": message.control,
            "key": _text(message.key),
            "payload": _text(message.payload),
        }
    return {"error": f"unknown op {op!r}"}


def main(argv: list[str]) -> int:
    address = argv[1]
    if len(argv) == 4:
        uid, gid = int(argv[2]), int(argv[3])
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    out = sys.stdout
    try:
        bus = Client(address, timeout=10, reconnect=False)  # a lost bus is what tests look for
    except (OSError, SbusError) as exc:
        out.write(json.dumps({"error": f"connect {address}: {exc}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "close":
            break
        try:
            answer = _handle(bus, request)
        except BusClosed as exc:
            answer = {"closed": exc.reason or str(exc)}
        except OSError as exc:
            answer = {"closed": str(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    bus.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
