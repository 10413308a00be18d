"""Secret keys under attack: nobody receives a ``!/cred/`` message meant for another identity.

One round: a master and one relay under it are running.  Child processes (each
its own pid, hence its own identity, protocol.md) connect to the master or to the
relay.  Each child holds two connections:

* ``main`` subscribes its own baseline ``<prefix>!/cred////`` (all of its secret
  messages), a fence key, and random patterns that the server must accept;
* ``wild`` subscribes random patterns that may be refused (other identities,
  ``*`` fields, truncated or prefix-less secret patterns, public wildcards such
  as ``""``, ``*``, ``*/``, ``!/``); the server may disconnect it.

The parent publishes, from the master and from the relay, keys addressed to
every child's identity chain, to its own, to strangers and to near misses
(a relay child's identity without the relay's prefix).  Then it publishes a
fence on both servers.  Every received secret key must start with the
receiver's own chain; every key addressed to a child must reach its ``main``
connection exactly once.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .common import Child, Closed, Conn, ServerProc, cleanup_dir, short_dir

#: Patterns a child's ``main`` connection may hold: never refused.  ``{P}`` is the
#: server's prefix (empty on the master), ``{g} {u} {p}`` the child's own fields.
SAFE = (
    b"{P}!/cred/{g}/{u}/{p}/",
    b"{P}!/cred///{p}/x",
    b"{P}!/cred/{g}///*",
    b"{P}!/cred/{g}/{u}//*/",
    b"{P}!/cred////!/cred/1/2/3/",
    b"{P}!/cred////x/",
    b"",
    b"*",
    b"*/",
    b"*/*/*/*/",
    b"pub/",
    b"cred/",
)
#: Patterns for the ``wild`` connection: mostly refused, a few accepted.  ``{G} {U}
#: {X}`` are fields that are not the child's; ``{Q}`` is a made-up relay prefix.
WILD = (
    b"!/",
    b"!/cred/",
    b"!/cred/*/*/*/",
    b"{P}!/cred/*///",
    b"{P}!/cred/{G}///",
    b"{P}!/cred//{U}//",
    b"{P}!/cred///{X}/",
    b"{P}!/cred///{X}",
    b"!/cred////",
    b"{Q}!/cred////",
    b"{P}!/cred/{g}/{u}",
    b"{P}!/cred/{g}/{u}/{p}",
    b"*/cred/",
    b"!/*/",
    b"*/*/*/*/*/*/*/*/*/",
    b"",
    b"*",
    b"*/",
    b"{P}!/cred/{g}/{u}/{p}/",
)
#: What a published key is addressed to (see ``_key``).
TARGETS = ("child", "child_no_prefix", "child_fake_prefix", "parent", "stranger", "public")
#: Rests appended after an identity chain; a unique ``/n<seq>`` follows.
RESTS = (b"x", b"x/y", b"", b"*", b"!/cred/1/2/3", b"pub", b"a/b/c")
SERVERS = ("master", "relay")
#: Seconds a round may take before it counts as hung.
ROUND_TIMEOUT = 30.0


@dataclass
class ChildPlan:
    server: str  # "master" or "relay"
    safe: list[bytes] = field(default_factory=list)
    wild: list[bytes] = field(default_factory=list)


@dataclass
class Publish:
    via: str  # "master" or "relay"
    target: str  # one of TARGETS
    child: int  # which child, for the child* targets (modulo the number of children)
    rest: bytes


@dataclass
class Plan:
    children: list[ChildPlan]
    publishes: list[Publish]


def random_plan(rng: random.Random) -> Plan:
    """A plan for ``run_round`` drawn from ``rng`` (the command's source of rounds)."""
    children = [
        ChildPlan(
            rng.choice(SERVERS),
            rng.sample(SAFE, rng.randint(0, 4)),
            rng.sample(WILD, rng.randint(0, 4)),
        )
        for _ in range(rng.randint(2, 4))
    ]
    publishes = [
        Publish(rng.choice(SERVERS), rng.choice(TARGETS), rng.randrange(4), rng.choice(RESTS))
        for _ in range(rng.randint(4, 24))
    ]
    return Plan(children, publishes)


def _fill(template: bytes, prefix: bytes, own: tuple[int, int, int], parent: int) -> bytes:
    gid, uid, pid = own
    values = {
        b"{P}": prefix,
        b"{Q}": b"!/cred/9/9/9/",
        b"{g}": b"%d" % gid,
        b"{u}": b"%d" % uid,
        b"{p}": b"%d" % pid,
        b"{G}": b"%d" % (gid + 1),
        b"{U}": b"%d" % (uid + 1),
        b"{X}": b"%d" % parent,
    }
    for name, value in values.items():
        template = template.replace(name, value)
    return template


def _child(address: str, plan: ChildPlan, fence: bytes, ready_fd: int, parent: int) -> dict:
    """One identity: subscribe, say ready, read until two fences; what arrived."""
    own = (os.getgid(), os.getuid(), os.getpid())
    main = Conn(address)
    chain = main.whoami()
    prefix = chain[: len(chain) - len(b"!/cred/%d/%d/%d" % own)]
    for pattern in (b"{P}!/cred////", fence, *plan.safe):
        main.sub(_fill(pattern, prefix, own, parent))
    main.sync()
    wild: Conn | None = Conn(address)
    refused = 0
    try:
        for pattern in plan.wild:
            wild.sub(_fill(pattern, prefix, own, parent))  # type: ignore[union-attr]
        wild.sub(fence)  # type: ignore[union-attr]
        wild.sync()  # type: ignore[union-attr]
    except (Closed, TimeoutError, OSError):
        refused = 1
        wild.close()  # type: ignore[union-attr]
        wild = None
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    got: dict[str, list[str]] = {"main": [], "wild": []}
    for name, conn in (("main", main), ("wild", wild)):
        if conn is None:
            continue
        fences = 0
        deadline = time.monotonic() + ROUND_TIMEOUT / 2
        while fences < 2:
            try:
                packet = conn.recv(max(0.01, deadline - time.monotonic()))
            except Closed:
                if name == "main":
                    raise
                break
            if packet.startswith(b"MSG "):
                key = packet[4 : packet.index(b"\0")]
                if key == fence:
                    fences += 1
                else:
                    got[name].append(key.decode("latin-1"))
        conn.close()
    return {"chain": chain.decode("latin-1"), "got": got, "wild_refused": refused}


def _barrier(master: Conn, relay: Conn, tag: bytes) -> None:
    """Wait until the relay and the master have each processed what the other sent.

    Down: a key subscribed on the master travels to the relay as interest/add after
    every earlier one; once a publish on the relay reaches the master, the relay
    knows all earlier interest.  Up: a SUB on the relay reaches the master after
    every earlier SUB; once a master publish reaches the relay, all are in place.
    """
    for sub_side, pub_side, name in ((master, relay, b"down"), (relay, master, b"up")):
        key = b"barrier/" + tag + b"/" + name
        sub_side.sub(key)
        sub_side.sync()
        deadline = time.monotonic() + 10.0
        while True:
            pub_side.pub(key)
            try:
                if sub_side.recv(0.05).startswith(b"MSG " + key + b"\0"):
                    break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise AssertionError("relay and master never synchronised") from None
        sub_side.unsub(key)
        sub_side.sync()
        time.sleep(0.05)
        while True:  # leftover copies of the barrier key
            try:
                sub_side.recv(0.01)
            except TimeoutError:
                break


def _key(pub: Publish, seq: int, chains: list[bytes], pids: list[int], env: dict) -> bytes:
    me = b"!/cred/%d/%d/" % (os.getgid(), os.getuid())
    target = pub.target
    k = pub.child % len(chains)
    if target == "child":
        head = chains[k]
    elif target == "child_no_prefix":
        head = me + b"%d" % pids[k]
    elif target == "child_fake_prefix":
        head = b"!/cred/9/9/9/" + me + b"%d" % pids[k]
    elif target == "parent":
        head = env["parent_chain"][pub.via]
    elif target == "stranger":
        head = me + b"%d" % (4_000_000 + seq)
    else:
        head = b"pub"
    return head + b"/" + pub.rest + b"/n%d" % seq


def run_round(master: str, relay: str, plan: Plan, tag: str) -> dict[str, Any]:
    """Run one plan; returns counts and the list of ``violations`` (empty: secrets held)."""
    addresses = {"master": master, "relay": relay}
    fence = b"fence/" + tag.encode()
    conns = {"master": Conn(master), "relay": Conn(relay)}
    try:
        parent_chain = {name: conn.whoami() for name, conn in conns.items()}
        children = []
        pipes = []
        for child_plan in plan.children:
            r, w = os.pipe()
            address = addresses[child_plan.server]
            children.append(Child(_child, address, child_plan, fence, w, os.getpid()))
            os.close(w)
            pipes.append(r)
        try:
            for r in pipes:  # every child has subscribed
                if not _read_ready(r, ROUND_TIMEOUT / 2):
                    raise AssertionError("a child never became ready")
            _barrier(conns["master"], conns["relay"], tag.encode())
            relay_prefix = parent_chain["relay"][: -len(parent_chain["master"])]
            pids = [c.pid for c in children]
            me = b"!/cred/%d/%d/" % (os.getgid(), os.getuid())
            chains = [
                (relay_prefix if p.server == "relay" else b"") + me + b"%d" % c.pid
                for p, c in zip(plan.children, children, strict=True)
            ]
            env = {"parent_chain": parent_chain}
            sent: list[bytes] = []
            for seq, pub in enumerate(plan.publishes):
                key = _key(pub, seq, chains, pids, env)
                conns[pub.via].pub(key, b"s")
                sent.append(key)
            for conn in conns.values():
                conn.pub(fence, b"end")
            results = [c.result(ROUND_TIMEOUT) for c in children]
        finally:
            for r in pipes:
                os.close(r)
            for c in children:
                c.kill()
    finally:
        for conn in conns.values():
            conn.close()
    violations: list[str] = []
    delivered = 0
    for k, result in enumerate(results):
        chain = result["chain"].encode("latin-1")
        if chain != chains[k]:
            violations.append(f"child {k}: whoami {chain!r}, expected {chains[k]!r}")
        own = chain + b"/"
        for name, keys in result["got"].items():
            for text in keys:
                key = text.encode("latin-1")
                if b"!/cred/" in key and not key.startswith(own):
                    violations.append(f"child {k} ({name}, {chain!r}) received {key!r}")
        main = [t.encode("latin-1") for t in result["got"]["main"]]
        for key in sent:
            if key.startswith(own):
                copies = main.count(key)
                delivered += copies
                if copies != 1:
                    violations.append(f"child {k}: {copies} copies of its own {key!r}")
    return {
        "children": len(results),
        "published": len(sent),
        "own_secret_deliveries": delivered,
        "wild_refused": sum(r["wild_refused"] for r in results),
        "violations": violations,
    }


def _read_ready(fd: int, timeout: float) -> bool:
    import select

    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 1) == b"r"


class Hierarchy:
    """A master and one relay under it (``sbus-relay serve --upstream``)."""

    def __init__(self) -> None:
        self.dir = short_dir()
        self.master = ServerProc(os.path.join(self.dir, "master"))
        self.relay = ServerProc(
            os.path.join(self.dir, "relay"), ["--upstream", self.master.address], kind="serve"
        )
        with Conn(self.relay.address) as probe:  # the relay knows its prefix
            probe.whoami()

    def close(self) -> list[str]:
        """Stop both; the problems seen (a dead server, a traceback in a log).

        Waits first for the master to finish with the last round's departures: a
        relay stopping while the master sends it interest notices trips a known
        server bug (tests/hardening/test_server_bugs.py), reported there, not here.
        """
        time.sleep(0.5)
        problems = []
        for server in (self.relay, self.master):
            if not server.alive():
                problems.append(f"{server.address} died ({server.proc.returncode})")
            elif server.stop() != 0:
                problems.append(f"{server.address} exited {server.proc.returncode}")
            if "Traceback" in server.log_text():
                problems.append(f"traceback in {server.log_path}")
        if not problems:  # keep the logs of a failed run for the report
            cleanup_dir(self.dir)
        return problems


def run_secret(rounds: int = 200, seed: int = 11) -> dict[str, Any]:
    """``rounds`` random plans against one master and relay; figures and failures."""
    rng = random.Random(seed)
    hierarchy = Hierarchy()
    started = time.monotonic()
    totals = {"rounds": 0, "children": 0, "published": 0, "own_secret_deliveries": 0,
              "wild_refused": 0}  # fmt: skip
    failures: list[str] = []
    try:
        for n in range(rounds):
            result = run_round(
                hierarchy.master.address, hierarchy.relay.address, random_plan(rng), f"{seed}-{n}"
            )
            totals["rounds"] += 1
            for name in ("children", "published", "own_secret_deliveries", "wild_refused"):
                totals[name] += result[name]
            failures += [f"round {n}: {v}" for v in result["violations"]]
    finally:
        failures += hierarchy.close()
    return {**totals, "seed": seed, "seconds": round(time.monotonic() - started, 1),
            "failures": failures}  # fmt: skip
