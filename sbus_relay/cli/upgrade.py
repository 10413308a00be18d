"""Upgrade running buses in place: sbus-relay upgrade [-a ADDRESS | TREE.yaml].

What it owns: the upgrade command: which buses it signals and how it waits for
them.  What it may touch: the buses' processes (signals), their addresses.

Nobody is disconnected (docs/deploy.md, "Upgrade"): the bus is sent SIGUSR2
and starts the installed version of itself, which takes every socket and
connection over.  A bus run by ``sbus-relay up`` is upgraded by its ``up``,
the whole tree at once (the master first): ``-a`` with one of its buses says
so and follows every bus of that tree.  This command waits until a new
process answers on each address and says, in one line per bus, which pid
serves it now, or why the old one still does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from .options import add_address_argument, bus_address

#: Seconds between two checks that the old process still runs (no connection).
POLL = 0.1
#: Seconds between two looks at who answers on an address while the old process
#: still runs (each look is a connection the bus logs); once it has ended, at once.
LOOK_EVERY = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """-a ADDRESS (one bus), or a hierarchy file (every bus ``up`` runs from it)."""
    add_address_argument(parser)
    parser.add_argument(
        "tree",
        nargs="?",
        metavar="TREE.yaml",
        help="a hierarchy file of `sbus-relay up`: upgrade every bus it runs",
    )


def _hierarchy_file(address: str) -> bool:
    """Whether ``-a`` names a YAML file (a tree for ``up``) rather than a socket."""
    return address.endswith((".yaml", ".yml")) and os.path.isfile(address)


def run(args: argparse.Namespace) -> int:
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.ops.children import children_of, process_status
    from sbus_relay.ops.hierarchy import load_hierarchy
    from sbus_relay.ops.supervisor import listener_pid, supervisor_of
    from sbus_relay.protocol.errors import UsageError
    from sbus_relay.protocol.limits import UPGRADE_WAIT

    if args.tree is not None and args.address is not None:
        raise UsageError("give -a ADDRESS or a hierarchy file, not both")
    if args.address is not None and _hierarchy_file(args.address):
        raise UsageError(
            f"{args.address} is a hierarchy file, not a bus's address: "
            f"sbus-relay upgrade {args.address} (without -a) upgrades every bus it runs"
        )
    if args.tree is not None:
        addresses = [(spec.name, spec.address) for spec in load_hierarchy(args.tree).buses]
    else:
        address = bus_address(args)
        addresses = [(address, address)]
    before: dict[str, int] = {}
    for name, address in addresses:
        pid = listener_pid(parse_address(address))
        if pid is None:
            print(f"sbus-relay upgrade: no bus answers on {address}", file=sys.stderr)
            return 1
        if pid == 0:
            raise UsageError(
                f"the bus on {address} runs in another PID namespace: send it SIGUSR2 there"
            )
        before[name] = pid
    # Whom to signal: a bus run by `up` is upgraded by its `up` (the whole tree).
    owners = {supervisor_of(pid) or pid for pid in before.values()}
    if args.tree is None:
        addresses = _whole_tree(addresses, before, owners)
    for pid in owners:
        try:
            os.kill(pid, signal.SIGUSR2)
        except PermissionError:
            raise UsageError(f"not allowed to signal pid {pid}: run this as its user") from None
        except ProcessLookupError:
            pass  # it ended meanwhile: reported below as not answering
    if args.tree is not None and owners != set(before.values()):
        print(f"sbus-relay upgrade: asked sbus-relay up (pid {', '.join(map(str, owners))})")
    status = 0
    deadline = time.monotonic() + UPGRADE_WAIT
    for name, address in addresses:
        old = before[name]
        now = old
        looked = 0.0
        started: set[int] = set()  # the processes the old one started to take over
        while time.monotonic() < deadline:
            process = process_status(old)
            ended = process is None or process[0] == "Z"  # a zombie has ended
            # A new process that ends while the old one runs has failed: the old
            # one reaped it and serves on (its log says why).
            running = children_of(old)
            failed = bool(started - running)
            started |= running
            if ended or failed or time.monotonic() - looked >= LOOK_EVERY:
                looked = time.monotonic()
                now = listener_pid(parse_address(address)) or 0
                # An old process ends only once it has handed over: its successor
                # may still be too busy to answer on a loaded machine, so look again.
                if now not in (old, 0) or failed or (ended and now == old):
                    break
            time.sleep(POLL)
        if now in (old, 0):
            still = f"is still pid {old}" if now == old else "answers no more"
            print(
                f"sbus-relay upgrade: {name}: the bus on {address} {still}: no new process took"
                " it over (its log says why)",
                file=sys.stderr,
            )
            status = 1
        else:
            print(f"{name}: pid {old} -> pid {now}")
    return status


def _whole_tree(
    addresses: list[tuple[str, str]], before: dict[str, int], owners: set[int]
) -> list[tuple[str, str]]:
    """``-a`` on a bus of an ``up`` tree: every bus of that tree is upgraded, so
    say so and follow them all (their pids noted in ``before``, before the signal)."""
    from sbus_relay.ops.addresses import parse_address
    from sbus_relay.ops.hierarchy import load_hierarchy
    from sbus_relay.ops.supervisor import listener_pid, tree_of
    from sbus_relay.protocol.errors import ConfigError

    ((given, address),) = addresses
    (owner,) = owners
    if owner == before[given]:
        return addresses  # a bus of its own
    tree = tree_of(owner)
    try:
        buses = load_hierarchy(tree).buses if tree is not None else ()
    except ConfigError:
        buses = ()  # edited since up read it: its buses are not known here
    ours = [spec for spec in buses if os.path.realpath(spec.address) == os.path.realpath(address)]
    if not ours:
        print(
            f"sbus-relay upgrade: {address} is run by sbus-relay up pid {owner}, which upgrades"
            " every bus of its tree; only this one is followed here"
        )
        return addresses
    pid = before.pop(given)
    followed = []
    for spec in buses:
        now = pid if spec is ours[0] else listener_pid(parse_address(spec.address))
        if now:
            before[spec.name] = now
            followed.append((spec.name, spec.address))
    names = ", ".join(name for name, _ in followed)
    print(
        f"sbus-relay upgrade: {address} is bus {ours[0].name} of {tree}, run by sbus-relay up"
        f" pid {owner}: it upgrades the whole tree, {len(followed)} buses ({names})"
    )
    return followed
