"""Every panel of the shipped dashboard returns data from a real Prometheus.

A master and a relay run as real ``sbus-relay serve`` processes with
``--metrics``; a real Prometheus (Debian's ``prometheus`` package) scrapes them
every second.  The test makes the traffic the dashboard is about -- messages
both ways through the relay, a stalled subscriber in ``blocking/soft/discard``,
a slow queueing subscriber, a protocol error, a reserved key, an upstream
outage (master stopped and restarted) and a relay that stops reading while the
master has messages for it -- then evaluates every panel's PromQL through
Prometheus's HTTP API.  An empty panel fails the test with its title and
expression.  The Who row must name the relay, by the name it announced, as the
one the master dropped messages for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.metrics.dashboard_queries import load_dashboard, panel_queries, row_panels
from tests.nats.cluster import NatsServer
from tests.support import free_port

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(180)]

VENV_BIN = Path(sys.executable).parent
#: Seconds between scrapes; short so that the test needs only a few seconds of data.
SCRAPE_INTERVAL = 1
#: Payload size of flood messages: big enough to fill a shrunken socket quickly.
FLOOD_PAYLOAD = b"x" * 2048
#: Messages published in a flood: well over what the socket buffers can hold.
FLOOD_COUNT = 1500
#: The master's per-client queue limit: a flood of FLOOD_COUNT overflows it.
MASTER_HARD_LIMIT = "1MiB"


# --- helpers -----------------------------------------------------------------


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def find_prometheus() -> str:
    path = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    if path is None:
        pytest.skip(
            "!!! PROMETHEUS NOT INSTALLED: the dashboard was NOT checked against a real "
            "Prometheus.  Install Debian's 'prometheus' package "
            "(apt-get install prometheus) and rerun. !!!"
        )
    return path


class Raw:
    """A bare SOCK_SEQPACKET client: what any reference-protocol client sends."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(5)
        self.sock.connect(address)

    def send(self, packet: bytes) -> None:
        self.sock.send(packet)

    def recv(self, timeout: float = 5.0) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(409_601)

    def sync(self) -> None:
        """Round-trip a whoami so that everything sent before has been processed."""
        self.send(b"CMSG !/cred/whoami")
        while not self.recv().startswith(b"CMSG !/cred/whoami\0"):
            pass

    def drain(self, quiet: float = 0.5) -> int:
        n = 0
        try:
            while self.recv(quiet):
                n += 1
        except TimeoutError:
            pass
        return n

    def close(self) -> None:
        self.sock.close()


@dataclass
class Bus:
    """One ``sbus-relay serve`` process with metrics; restartable at the same place."""

    name: str
    address: str
    metrics_port: int
    extra: tuple[str, ...]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            str(VENV_BIN / "sbus-relay"),
            "serve",
            "-f",
            "-a",
            self.address,
            "--metrics",
            f"127.0.0.1:{self.metrics_port}",
            *self.extra,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait_for(f"{self.name} to accept and serve /metrics", self._ready)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        try:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(self.address)
            finally:
                probe.close()
            return http_get(self.metrics_url(), timeout=1)[0] == 200
        except OSError:
            return False

    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metrics_text(self) -> str:
        status, body = http_get(self.metrics_url())
        assert status == 200
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The structlog JSON events this process wrote (non-JSON lines skipped)."""
        out = []
        for line in self.log().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out


class Prometheus:
    """A real Prometheus scraping the given buses every second."""

    def __init__(self, binary: str, workdir: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        # Same shape as configs/prometheus.yml: one job, an instance label per target.
        static = "\n".join(
            f"      - targets: ['127.0.0.1:{port}']\n        labels: {{instance: {name}}}"
            for name, port in targets.items()
        )
        config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL}s\n"
            f"  evaluation_interval: {SCRAPE_INTERVAL}s\n"
            "scrape_configs:\n"
            "  - job_name: sbus\n"
            "    scrape_timeout: 900ms\n"
            "    static_configs:\n"
            f"{static}\n"
        )
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    # A fresh tmp dir each run: nothing to keep, nothing to lock out.
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        wait_for("Prometheus to be ready", self._ready, timeout=30)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()}")
        try:
            return http_get(f"{self.url}/-/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns the result vector (raises on a PromQL error)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, body = http_get(url)
        reply = json.loads(body)
        assert status == 200 and reply["status"] == "success", f"{promql}: {reply}"
        assert reply["data"]["resultType"] == "vector", reply["data"]["resultType"]
        result: list[dict[str, Any]] = reply["data"]["result"]
        return result

    def value(self, promql: str) -> float:
        """The single value of a query that must return exactly one sample."""
        result = self.query(promql)
        assert len(result) == 1, f"{promql}: {result}"
        return float(result[0]["value"][1])

    def label_values(self, label: str, match: str) -> list[str]:
        url = f"{self.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode(
            {"match[]": match}
        )
        values: list[str] = json.loads(http_get(url)[1])["data"]
        return values

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- fixtures ------------------------------------------------------------------


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short path under /tmp: socket paths must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="sbm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def require_cli(*flags: str) -> None:
    """The server CLI must exist and accept ``flags``; say clearly which is missing."""
    exe = VENV_BIN / "sbus-relay"
    assert exe.exists(), f"{exe} missing: is the package installed in the venv?"
    result = subprocess.run(
        [str(exe), "serve", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, f"sbus-relay serve --help failed:\n{result.stderr}"
    missing = [f for f in flags if f not in result.stdout]
    assert not missing, f"sbus-relay serve does not accept {missing}"


@pytest.fixture
def hierarchy(workdir: Path) -> Iterator[tuple[Bus, Bus]]:
    find_prometheus()  # skip before starting anything when it is missing
    require_cli("--metrics", "--upstream", "--instance", "--hard-limit-bytes")
    # the master is joined to NATS (alone there): the NATS row has its series
    nats = NatsServer(workdir, "dash", free_port(), free_port(), [])
    master = Bus(
        "master",
        str(workdir / "master"),
        free_port(),
        ("--instance", "the-master", "--hard-limit-bytes", MASTER_HARD_LIMIT, "--nats", nats.url),
        workdir / "master.log",
    )
    relay = Bus(
        "relay",
        str(workdir / "relay"),
        free_port(),
        ("--instance", "the-relay", "--upstream", master.address),
        workdir / "relay.log",
    )
    try:
        master.start()
        relay.start()
        yield master, relay
    finally:
        relay.stop()
        master.stop()
        nats.stop()


@pytest.fixture
def prometheus(workdir: Path, hierarchy: tuple[Bus, Bus]) -> Iterator[Prometheus]:
    binary = find_prometheus()
    master, relay = hierarchy
    prom = Prometheus(binary, workdir, {"master": master.metrics_port, "relay": relay.metrics_port})
    try:
        yield prom
    finally:
        prom.stop()


# --- the scenario -------------------------------------------------------------------


def upstream_outage(master: Bus, relay: Bus, prom: Prometheus) -> None:
    """Stop the master long enough to be scraped as down, publish meanwhile, restart."""
    wait_for(
        "relay connected upstream (as scraped)",
        lambda: any(
            r["value"][1] == "1" for r in prom.query('sbus_upstream_connected{instance="relay"}')
        ),
    )
    master.stop()
    local = Raw(relay.address)
    try:
        for i in range(5):
            local.send(b"MSG outage/%d\0queued while the master is away" % i)
        local.sync()
        wait_for(
            "the outage to be scraped",
            lambda: bool(prom.query('sbus_upstream_connected{instance="relay"} == 0')),
        )
    finally:
        local.close()
    master.start()
    wait_for(
        "the relay to reconnect",
        lambda: "sbus_upstream_connected 1.0" in relay.metrics_text(),
    )


def traffic(bus: Bus, *, rounds: int = 20) -> None:
    """Ordinary messages, delivered to a subscriber that reads."""
    sub, pub = Raw(bus.address), Raw(bus.address)
    try:
        sub.send(b"SUB t/")
        sub.send(b"SUB t/")  # a duplicate: patterns_stored counts it twice
        sub.sync()
        for i in range(rounds):
            pub.send(b"MSG t/%d\0hello" % i)
        pub.sync()
        assert sub.drain() >= rounds
    finally:
        sub.close()
        pub.close()


def floods(bus: Bus) -> list[Raw]:
    """A stalled soft/discard subscriber and a slow queueing one; returns them open.

    The discarding one never reads, so once its socket is full every further
    message is a ``soft_discard`` drop.  The queueing one reads only later, so
    its messages wait in the server's queue (queue depth, queue-wait histogram).
    """
    stalled, slow, pub = Raw(bus.address), Raw(bus.address), Raw(bus.address)
    for client in (stalled, slow):
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        client.send(b"SUB flood/")
    stalled.send(b"CMSG blocking/soft/discard")
    stalled.sync()
    slow.sync()
    for i in range(FLOOD_COUNT):
        pub.send(b"MSG flood/%d\0" % i + FLOOD_PAYLOAD)
    pub.send(b"MSG !/reserved\0a reserved key: dropped and counted")
    pub.sync()
    pub.close()
    return [stalled, slow]


def stalled_relay(master: Bus, relay: Bus) -> None:
    """The relay stops reading (SIGSTOP) while the master publishes what it wants.

    The master queues the messages for the relay's connection up to its hard
    limit and drops the rest (``hard_discard``), on the relay's account: the
    ``relay`` label the master gives that connection is the relay's announced
    instance name.  Held for a few scrapes, then the relay goes on.
    """
    assert relay.proc is not None
    relay.proc.send_signal(signal.SIGSTOP)
    try:
        pub = Raw(master.address)
        for i in range(FLOOD_COUNT):
            pub.send(b"MSG both/stalled/%d\0" % i + FLOOD_PAYLOAD)
        pub.sync()
        pub.close()
        time.sleep(3 * SCRAPE_INTERVAL)
    finally:
        relay.proc.send_signal(signal.SIGCONT)


def another_host(nats_url: str, master: str) -> None:
    """A NATS client posing as another host sends the master (joined to NATS) a
    message twice and counts three: one delivered, one refused (duplicate),
    two lost (the NATS row's loss panel)."""
    import asyncio

    from sbus_relay.protocol.natsenvelope import HEADER
    from sbus_relay.protocol.natsinterest import decode

    async def run() -> None:
        import nats

        nc = await nats.connect(nats_url)
        heard: asyncio.Queue[bytes] = asyncio.Queue()

        async def announced(msg: Any) -> None:
            heard.put_nowait(msg.data)

        await nc.subscribe(f"sbus._i.{master}", cb=announced)
        await nc.publish("sbus._q", master.encode())  # its snapshot, now
        a = decode(await asyncio.wait_for(heard.get(), 10))
        assert a is not None
        counts = f"sbus._s.{master}"
        await nc.publish(
            counts, b"%d %d 0 0" % (a.incarnation, a.seq), headers={HEADER: "hostx 1 0"}
        )
        for _ in range(2):
            await nc.publish("sbus.k.both.x", b"from hostx", headers={HEADER: "hostx 1 1"})
        await nc.publish(
            counts, b"%d %d 0 3" % (a.incarnation, a.seq), headers={HEADER: "hostx 1 3"}
        )
        await nc.flush()
        await nc.close()

    asyncio.run(run())


def protocol_error(bus: Bus) -> None:
    """Junk on the wire: the server must close that client (docs/protocol.md)."""
    junk = Raw(bus.address)
    try:
        junk.send(b"HELO this is not sbus")
        notice = junk.recv(1000)  # told why first (docs/protocol.md, "disconnect")
        assert notice.startswith(b"CMSG disconnect\0protocol_error"), notice
        try:
            data = junk.recv(5)
            if data.startswith(b"CMSG disconnect\0"):  # the server says why first
                data = junk.recv(5)
        except ConnectionResetError:
            data = b""
        assert data == b"", f"{bus.name} did not close a client that sent junk"
    finally:
        junk.close()


def test_every_dashboard_panel_returns_data(
    hierarchy: tuple[Bus, Bus], prometheus: Prometheus
) -> None:
    master, relay = hierarchy
    prom = prometheus

    upstream_outage(master, relay, prom)

    # Both directions through the relay: a master subscriber pulls relay
    # publishes up, a relay subscriber pulls master publishes down.
    down_sub, up_sub = Raw(relay.address), Raw(master.address)
    down_sub.send(b"SUB both/")
    up_sub.send(b"SUB both/")
    down_sub.sync()
    up_sub.sync()
    time.sleep(0.5)  # interest propagation is asynchronous across the link
    for bus in (master, relay):
        traffic(bus)
        publisher = Raw(bus.address)
        for i in range(10):
            publisher.send(b"MSG both/%d\0from %s" % (i, bus.name.encode()))
        publisher.sync()
        publisher.close()
    another_host(master.extra[master.extra.index("--nats") + 1], "the-master")
    held = floods(master) + floods(relay)
    protocol_error(master)
    protocol_error(relay)
    stalled_relay(master, relay)

    # Keep the queues full across a few scrapes, then drain the slow readers so
    # their messages finally leave the queue and are timed.
    time.sleep(4 * SCRAPE_INTERVAL)
    for client in held[1::2]:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        client.drain(quiet=1.0)
    time.sleep(5 * SCRAPE_INTERVAL)

    # -- every panel returns data --------------------------------------------
    report: list[str] = []
    empty: list[str] = []
    for q in panel_queries():
        result = prom.query(q.promql())
        values = sorted(
            r["metric"].get("instance", "")
            + "".join(
                f"/{r['metric'][label]}"
                for label in ("reason", "relay", "uid")
                if label in r["metric"]
            )
            + f"={r['value'][1]}"
            for r in result
        )
        report.append(
            f"[{'ok' if result else 'EMPTY'}] {q.panel} / {q.ref_id}: {q.expr}\n"
            f"        -> {', '.join(values)[:300]}"
        )
        if not result:
            empty.append(f"{q.panel} / {q.ref_id}: {q.promql()}")
    print("\n".join(report))
    assert not empty, "panels with no data:\n" + "\n".join(empty)

    # -- and the data says what happened ---------------------------------------
    assert prom.label_values("instance", "sbus_build_info") == ["master", "relay"]
    problems = []

    def expect(what: str, promql: str) -> None:
        if not prom.query(promql):
            problems.append(f"{what}: {promql}")

    for inst in ("master", "relay"):
        sel = f'instance="{inst}"'
        expect(
            f"{inst} soft_discard drops",
            f'sbus_messages_dropped_total{{{sel}, reason="soft_discard"}} > 0',
        )
        expect(
            f"{inst} reserved_key drops",
            f'sbus_messages_dropped_total{{{sel}, reason="reserved_key"}} > 0',
        )
        expect(
            f"{inst} protocol_error disconnects",
            f'sbus_disconnects_total{{{sel}, reason="protocol_error"}} > 0',
        )
        expect(
            f"{inst} invalid packets", f'sbus_packets_received_total{{{sel}, type="invalid"}} > 0'
        )
        expect(f"{inst} delivered", f"sbus_messages_delivered_total{{{sel}}} > 0")
        expect(f"{inst} bytes out", f"sbus_sent_bytes_total{{{sel}}} > 0")
        expect(f"{inst} queue depth seen", f"max_over_time(sbus_queued_messages{{{sel}}}[5m]) > 0")
        expect(
            f"{inst} largest queue seen",
            f"max_over_time(sbus_largest_queue_bytes{{{sel}}}[5m]) > 0",
        )
        expect(f"{inst} queue waits timed", f"sbus_queue_wait_seconds_count{{{sel}}} > 0")
        expect(
            f"{inst} soft/discard client seen",
            f'max_over_time(sbus_clients_soft_mode{{{sel}, mode="discard"}}[5m]) > 0',
        )
        expect(f"{inst} patterns seen", f"max_over_time(sbus_patterns_stored{{{sel}}}[5m]) > 0")
        expect(
            f"{inst} clients dropping seen",
            f"max_over_time(sbus_clients_dropping{{{sel}}}[5m]) > 0",
        )
    expect(
        "two lost on the way from another host, counted by the master",
        'sum(sbus_nats_lost_messages_total{instance="master", origin="hostx"}) == 2',
    )
    expect(
        "its duplicate refused",
        'sbus_nats_refused_messages_total{instance="master", origin="hostx", reason="duplicate"}'
        " == 1",
    )
    expect("relay reconnected", 'sbus_upstream_reconnects_total{instance="relay"} >= 1')
    expect("relay outage seen", 'min_over_time(sbus_upstream_connected{instance="relay"}[5m]) == 0')
    expect("relay connected now", 'sbus_upstream_connected{instance="relay"} == 1')
    expect("master scrape down seen", 'min_over_time(up{instance="master"}[5m]) == 0')
    expect("forwarded up", 'sbus_upstream_forwarded_messages_total{direction="up"} > 0')
    expect("forwarded down", 'sbus_upstream_forwarded_messages_total{direction="down"} > 0')
    expect(
        "upward queue seen during the outage",
        'max_over_time(sbus_upstream_queued_messages{instance="relay"}[5m]) > 0',
    )
    expect("build info", 'sbus_build_info{instance="master", role="master", name="the-master"}')
    expect("build info", 'sbus_build_info{instance="relay", role="relay", name="the-relay"}')
    expect("upstream interest known", 'sbus_upstream_interest_patterns{instance="relay"} > 0')
    expect("process metrics", 'process_resident_memory_bytes{instance="relay"} > 0')
    # Who: each bus accounts its own clients as relay "local" and by uid; the
    # master accounts the relay's connection under the name the relay announced.
    uid = os.getuid()
    for inst in ("master", "relay"):
        local = f'instance="{inst}", relay="local"'
        user = f'instance="{inst}", uid="{uid}"'
        expect(f"{inst} local publishers", f"sbus_relay_messages_in_total{{{local}}} > 0")
        expect(f"{inst} publishing user", f"sbus_user_messages_in_total{{{user}}} > 0")
        expect(
            f"{inst} drops for local clients", f"sbus_relay_dropped_messages_total{{{local}}} > 0"
        )
        expect(f"{inst} drops for the user", f"sbus_user_dropped_messages_total{{{user}}} > 0")
        expect(f"{inst} local disconnects", f"sbus_relay_disconnects_total{{{local}}} > 0")
        expect(f"{inst} user disconnects", f"sbus_user_disconnects_total{{{user}}} > 0")
        expect(
            f"{inst} local queue seen",
            f"max_over_time(sbus_relay_queued_messages{{{local}}}[5m]) > 0",
        )
        expect(
            f"{inst} user queue seen", f"max_over_time(sbus_user_queued_bytes{{{user}}}[5m]) > 0"
        )
    named = 'instance="master", relay="the-relay"'
    expect("master names the relay", f"sbus_relay_connections{{{named}}} == 1")
    expect("the relay published up", f"sbus_relay_messages_in_total{{{named}}} > 0")
    expect("drops for the stalled relay", f"sbus_relay_dropped_messages_total{{{named}}} > 0")
    expect(
        "the stalled relay's queue seen",
        f"max_over_time(sbus_relay_queued_bytes{{{named}}}[5m]) > 0",
    )
    assert not problems, "metrics that stayed at zero:\n" + "\n".join(problems)

    # -- the Who row answers "which container did the master drop messages for" --
    (droppers,) = [
        p for p in row_panels(load_dashboard(), "Who") if p["title"] == "Top droppers by relay"
    ]
    (target,) = droppers["targets"]
    shown = {
        (r["metric"]["instance"], r["metric"]["relay"])
        for r in prom.query(panel_queries({"panels": [droppers]})[0].promql())
    }
    assert ("master", "the-relay") in shown, (target["expr"], shown)

    # -- the live exposition lints clean -----------------------------------------
    promtool = shutil.which("promtool") or shutil.which("promtool", path="/usr/bin")
    if promtool:
        for bus in (master, relay):
            lint = subprocess.run(
                [promtool, "check", "metrics"],
                input=bus.metrics_text().encode(),
                capture_output=True,
                timeout=20,
            )
            assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr

    # -- logs: stable event names, drops logged per episode not per message ------
    for client in held:
        client.close()
    time.sleep(2.5)  # past two EPISODE_QUIET ticks, so ended episodes are logged
    for bus in (master, relay):
        events = bus.events()
        names = {e.get("event") for e in events}
        for name in (
            "metrics.listening",
            "client.connected",
            "client.disconnected",
            "flood.drop",
            "flood.drop.ended",
        ):
            assert name in names, f"{bus.name}: no {name!r} event in\n{bus.log()[-2000:]}"
        reasons = {e.get("reason") for e in events if e.get("event") == "client.disconnected"}
        assert "protocol_error" in reasons, reasons
        began = [e for e in events if e.get("event") == "flood.drop"]
        assert all(e.get("reason") and e.get("soft") for e in began), began
        ended = [e for e in events if e.get("event") == "flood.drop.ended"]
        assert all(isinstance(e.get("count"), int) and e["count"] > 0 for e in ended), ended
        # Hundreds of messages were discarded; a line per message would show here.
        assert len(began) + len(ended) < 20, f"{bus.name}: {len(began + ended)} drop lines"
    for name in ("upstream.connected", "upstream.lost"):
        assert name in {e.get("event") for e in relay.events()}, (
            f"relay: no {name!r} event in\n{relay.log()[-2000:]}"
        )
    down_sub.close()
    up_sub.close()
