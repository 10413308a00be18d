"""A private network of "hosts" for the fleet fault run: namespaces, a bridge, veth pairs.

Owns every network namespace, link and address it makes, and nothing else of
the machine's: it reads the machine's routes only to choose a range that
cannot collide with them.  As root, with ``ip`` (iproute2):

* a *switch* namespace holding one bridge, ``br0``;
* per host ``i`` two namespaces: ``h<i>`` for its buses and ``n<i>`` for its
  NATS member, each joined to the bridge by a veth pair (``eth0`` inside, a
  port of the bridge outside), and joined to each other by a third pair
  (``int0`` on both sides): the host's own loopback between its master and
  its member, which stays up when the host is cut off;
* addresses from one /24 of 198.18.0.0/15 (the benchmarking range, RFC 2544)
  that no route or address of the machine overlaps: hosts ``.1-.3`` and
  members ``.11-.13`` on the bridge (a /25), the internal pairs /30s above
  ``.128``.

Every link is made inside the namespaces (``ip link add ... netns``), so the
machine's own namespace never holds any of it, and deleting the namespaces
deletes it all.  A host is cut off by setting its bridge ports down
(``cut``): its packets vanish without an error, as behind a pulled cable.
Namespace names carry the creating process's pid (``sbfc<pid>x<tag>-...``), so
that a later fabric removes what a killed run left (``sweep_stale``).

Programs run inside with ``ip netns exec`` (which execs: the pid is the
program's); ``http_get`` reaches a port inside a namespace from a thread that
joined it (``setns`` moves only the calling thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

#: Every name this module gives a namespace begins so.
PREFIX = "sbfc"
#: Where ``ip netns`` keeps its namespaces.
NETNS_DIR = "/var/run/netns"
#: Candidate /24s, tried in turn: 198.18.0.0/15 is reserved for benchmarking.
CANDIDATES = tuple(ipaddress.IPv4Network("198.18.0.0/15").subnets(new_prefix=24))[77::37]
#: The names of the links a fabric makes (all inside its namespaces).
LINK_NAMES = frozenset({"br0", "eth0", "int0", *(f"{k}{i}" for k in "hn" for i in range(1, 10))})
#: Seconds a single ``ip`` command may take.
IP_TIMEOUT = 20.0
#: Seconds a namespace's processes get to vanish after SIGKILL.
KILL_WAIT = 10.0
CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)
_T = TypeVar("_T")


class FabricError(RuntimeError):
    """An ``ip`` command failed: the command and what it said."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["ip", *args],
        capture_output=True,
        timeout=IP_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        raise FabricError(f"`ip {' '.join(args)}` failed with exit {done.returncode}: {err}")
    return done.stdout.decode(errors="replace")


def fabric_problem() -> str | None:
    """Why a fabric cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return f"network namespaces need root (euid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on PATH"
    probe = f"{PREFIX}{os.getpid()}xprobe"
    try:
        _ip("netns", "add", probe)
    except (FabricError, OSError, subprocess.TimeoutExpired) as exc:
        return f"no network namespace support: {exc}"
    try:
        _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        _ip("link", "add", "name", "a", "netns", probe, "type", "veth", "peer", "name", "b",
            "netns", probe)  # fmt: skip
    except (FabricError, OSError, subprocess.TimeoutExpired) as exc:
        return f"no bridge or veth support in a network namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespaces(prefix: str = PREFIX) -> list[str]:
    """The names of the namespaces ``ip netns`` knows that begin with ``prefix``."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def machine_links() -> set[str]:
    """The names of the links of the machine's own namespace."""
    out = _ip("-o", "link", "show")
    return {line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _pids_in(name: str) -> list[int]:
    out = _ip("netns", "pids", name, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _remove(name: str) -> None:
    """Kill whatever runs in namespace ``name``, then delete it."""
    deadline = time.monotonic() + KILL_WAIT
    while True:
        pids = _pids_in(name)
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _ip("netns", "del", name, check=False)


def sweep_stale() -> list[str]:
    """Remove the namespaces of fabrics whose process has died; their names."""
    gone = []
    for name in namespaces():
        owner = name[len(PREFIX) :].split("x", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            _remove(name)
            gone.append(name)
    return gone


def machine_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination and address of the machine's own namespace, but
    the default route (which overlaps everything by design)."""
    found = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        words = line.split()
        if words and words[0] in ("local", "broadcast", "unicast", "anycast", "multicast"):
            words = words[1:]
        if words and words[0] != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_network(words[0], strict=False))
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        words = line.split()
        if "inet" in words:
            found.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    return [n for n in found if isinstance(n, ipaddress.IPv4Network)]


def choose_range() -> ipaddress.IPv4Network:
    """The first candidate /24 that nothing of the machine overlaps."""
    taken = machine_networks()
    for net in CANDIDATES:
        if not any(net.overlaps(other) for other in taken):
            return net
    raise FabricError(f"every candidate range overlaps a route of this machine: {taken}")


def in_netns(name: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` run by a thread that joined namespace ``name``'s network (so its
    sockets are made there); its result, or its exception."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
            try:
                if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def http_get(name: str, url: str, timeout: float = 5.0) -> str:
    """GET ``url`` from inside namespace ``name``'s network."""

    def get() -> str:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())

    return in_netns(name, get)


class Fabric:
    """``hosts`` hosts (a bus namespace and a member namespace each) on one bridge."""

    def __init__(self, hosts: int = 3) -> None:
        sweep_stale()
        self.tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(2)}"
        self.hosts = hosts
        self.made: list[str] = []
        self.net = choose_range()
        base = self.net.network_address
        #: bridge addresses of host i's buses and of its member (i from 1)
        self.host_addr = {i: str(base + i) for i in range(1, hosts + 1)}
        self.member_addr = {i: str(base + 10 + i) for i in range(1, hosts + 1)}
        #: the internal pair of host i: (bus side, member side)
        self.internal = {i: (str(base + 128 + 4 * i + 1), str(base + 128 + 4 * i + 2))
                         for i in range(1, hosts + 1)}  # fmt: skip
        self.down: set[str] = set()
        #: the machine's own links before (none of ours may ever appear there)
        self.links_before = machine_links()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def ns(self, kind: str, i: int | None = None) -> str:
        """The name of namespace ``sw``, ``h<i>`` or ``n<i>``."""
        return f"{self.tag}-{kind}{'' if i is None else i}"

    def _add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        sw = self.ns("sw")
        self._add(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i in range(1, self.hosts + 1):
            for kind, addr in (("h", self.host_addr[i]), ("n", self.member_addr[i])):
                inside = self.ns(kind, i)
                self._add(inside)
                port = f"{kind}{i}"
                _ip("link", "add", "name", port, "netns", sw, "type", "veth",
                    "peer", "name", "eth0", "netns", inside)  # fmt: skip
                _ip("-n", sw, "link", "set", port, "master", "br0")
                _ip("-n", sw, "link", "set", port, "up")
                _ip("-n", inside, "addr", "add", f"{addr}/25", "dev", "eth0")
                _ip("-n", inside, "link", "set", "eth0", "up")
            bus_side, member_side = self.internal[i]
            _ip("link", "add", "name", "int0", "netns", self.ns("h", i), "type", "veth",
                "peer", "name", "int0", "netns", self.ns("n", i))  # fmt: skip
            for kind, addr in (("h", bus_side), ("n", member_side)):
                _ip("-n", self.ns(kind, i), "addr", "add", f"{addr}/30", "dev", "int0")
                _ip("-n", self.ns(kind, i), "link", "set", "int0", "up")

    # --- faults ----------------------------------------------------------------------

    def _set(self, where: str, link: str, state: str) -> None:
        _ip("-n", where, "link", "set", link, state)
        key = f"{where}/{link}"
        (self.down.add if state == "down" else self.down.discard)(key)

    def cut_host(self, i: int) -> None:
        """Host ``i``'s machine off the network: its buses' and its member's bridge
        ports down; its master still reaches its own member."""
        self._set(self.ns("sw"), f"h{i}", "down")
        self._set(self.ns("sw"), f"n{i}", "down")

    def heal_host(self, i: int) -> None:
        self._set(self.ns("sw"), f"h{i}", "up")
        self._set(self.ns("sw"), f"n{i}", "up")

    def cut_member(self, i: int) -> None:
        """Host ``i``'s NATS member unreachable to everyone, its own host too."""
        self._set(self.ns("sw"), f"n{i}", "down")
        self._set(self.ns("n", i), "int0", "down")

    def heal_member(self, i: int) -> None:
        self._set(self.ns("sw"), f"n{i}", "up")
        self._set(self.ns("n", i), "int0", "up")

    # --- programs ----------------------------------------------------------------------

    def exec_argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``name``."""
        return ["ip", "netns", "exec", name, *argv]

    def reachable(self, src: str, addr: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from namespace ``src`` to ``addr:port`` is answered
        (refused counts: something answered)."""
        import socket

        def probe() -> bool:
            try:
                with socket.create_connection((addr, port), timeout=timeout):
                    return True
            except ConnectionRefusedError:
                return True
            except OSError:
                return False

        return in_netns(src, probe)

    # --- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process left in the fabric's namespaces and delete them (and so
        every link and address in them)."""
        for name in reversed(self.made):
            _remove(name)
        self.made = [n for n in self.made if n in namespaces(self.tag)]

    def leftovers(self) -> list[str]:
        """What of this fabric still exists: its namespaces, and links of its names
        that appeared in the machine's own namespace."""
        new = (machine_links() - self.links_before) & LINK_NAMES
        return namespaces(self.tag) + sorted(f"link {n}" for n in new)

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
