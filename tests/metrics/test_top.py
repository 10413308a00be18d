"""``sbus-relay top`` against real servers: real clients make traffic, top must see it.

Every bus is a real ``sbus-relay serve`` (or a hierarchy run by ``sbus-relay
up``) with its metrics server on a free port, and every client a real
connection: a ``sbus-relay sub`` process reading, a subscriber that never
reads (its queue fills and it drops), and a publisher thread.  The
interactive view runs in a real terminal (tmux), driven by keys.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sbus_relay.client import Client
from sbus_relay.protocol.errors import BusClosed
from tests.relay.helpers import WAIT, Bus, Peer, wait_until
from tests.relay.test_up import Up, sideways
from tests.support import VENV_BIN, run_cli, short_dir, wait_for_text

pytestmark = pytest.mark.timeout(90)

#: Payload of each published message.
PAYLOAD = b"x" * 100
#: Seconds between publishes (a few hundred messages a second).
PUBLISH_PAUSE = 0.002
#: Queue bound of the test bus, so that a subscriber that never reads drops soon.
HARD_LIMIT = "20"
#: The columns of the client table, as ``top`` prints them.
CLIENT_COLUMNS = [
    "CID", "RELAY", "UID", "PID", "STATE", "PATS", "IN/s", "OUT/s", "IN_B/s", "OUT_B/s",
    "DROP/s", "DROPPED", "QUEUED", "Q_BYTES", "AGE",
]  # fmt: skip
_UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def rate(text: str) -> float:
    """A rate as top prints it (``-``, ``0``, ``12.5``, ``1.2k``) as a number; -1 if unknown."""
    if text == "-":
        return -1.0
    match = re.fullmatch(r"([0-9.]+)([kMG]?)", text)
    assert match, f"not a rate: {text!r}"
    return float(match.group(1)) * _UNITS[match.group(2)]


def sections(text: str) -> dict[str, list[str]]:
    """The snapshot's lines under each bus header, keyed by the header's first word."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines()[1:]:
        if not line:
            current = None
        elif current is None:
            current = found.setdefault(line.split()[0], [line])
        else:
            current.append(line)
    return found


def client_table(lines: list[str]) -> list[dict[str, str]]:
    """The rows of one bus's client table as column -> text."""
    assert [c.rstrip("*") for c in lines[2].split()] == CLIENT_COLUMNS, lines[2]
    return [dict(zip(CLIENT_COLUMNS, row.split(), strict=True)) for row in lines[3:]]


class Traffic:
    """Real clients on one bus: a reading ``sub`` process, a stalled subscriber, a publisher."""

    def __init__(self, address: str, tmp_path: Path, key: bytes = b"load/x") -> None:
        err = tmp_path / f"sub-{time.monotonic_ns()}.err"
        with open(err, "wb") as stream:
            self.reader = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "sub", "-a", address, "-v", "load/"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stream,
            )
        wait_for_text(str(err), "subscribed", WAIT, self.reader)
        self.stalled = Client(address, timeout=WAIT)
        self.stalled.subscribe(b"load/")
        self.stalled.whoami()  # subscribed; from now on it never reads
        self.publisher = Client(address, timeout=WAIT)
        self.key = key
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        while not self._stop.is_set():
            try:
                self.publisher.publish(self.key, PAYLOAD)
            except (OSError, BusClosed):
                return  # the test stopped the bus
            self.sent += 1
            time.sleep(PUBLISH_PAUSE)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)
        self.publisher.close()
        self.stalled.close()
        self.reader.terminate()
        self.reader.wait(WAIT)


def dropped(bus: Bus) -> float:
    return sum(v for k, v in bus.metrics().items() if k.startswith("sbus_messages_dropped_total"))


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Bus, Traffic]]:
    """A real master with metrics, and traffic on it all along: one for every
    test that only looks at it (each runs ``top`` against it, none changes it)."""
    tmp_path = tmp_path_factory.mktemp("busy")
    address = os.path.join(short_dir(), "bus")
    bus = Bus(tmp_path, address, "--instance", "the-master", "--hard-limit-messages", HARD_LIMIT)
    traffic = Traffic(address, tmp_path)
    try:
        # Until the stalled subscriber's queue is full and it drops.
        wait_until(lambda: dropped(bus) > 0, "the stalled subscriber to drop messages")
        yield bus, traffic
    finally:
        traffic.close()
        bus.process.stop()
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


def top(*args: str) -> subprocess.CompletedProcess[bytes]:
    done = run_cli("top", *args, timeout=60)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done


# --- one snapshot ------------------------------------------------------------------


def test_once_shows_every_client_of_a_real_bus_with_real_rates(busy: tuple[Bus, Traffic]) -> None:
    bus, traffic = busy
    done = top("--metrics", f"127.0.0.1:{bus.port}", "--once")
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    text = done.stdout.decode()
    (lines,) = sections(text).values()
    header = lines[0]
    assert header.startswith(f"the-master at 127.0.0.1:{bus.port}  role master  up "), text
    assert header.endswith("  clients 3"), text  # a master: no upstream
    assert re.fullmatch(r"  in [0-9.]+[kM]? msg/s .*", lines[1]), text
    assert not lines[1].startswith("  in 0 msg/s"), text
    rows = client_table(lines)
    assert len(rows) == 3, text
    reader = next(r for r in rows if r["PID"] == str(traffic.reader.pid))
    ours = [r for r in rows if r["PID"] == str(os.getpid())]
    publisher = next(r for r in ours if r["PATS"] == "0")
    stalled = next(r for r in ours if r["PATS"] == "1")
    assert {r["RELAY"] for r in rows} == {"local"} and {r["UID"] for r in rows} == {
        str(os.getuid())
    }
    assert rate(publisher["IN/s"]) > 10, text  # it publishes a few hundred a second
    assert rate(reader["OUT/s"]) > 10, text  # every message is delivered to it
    assert rate(reader["IN/s"]) == 0 and rate(publisher["OUT/s"]) == 0, text
    # The stalled subscriber: its queue is at the bound and it keeps dropping,
    # and it is marked so; nobody else is.
    assert int(stalled["QUEUED"]) > 0 and stalled["Q_BYTES"] != "0B", text
    assert int(stalled["DROPPED"]) > 0 and rate(stalled["DROP/s"]) > 0, text
    assert stalled["STATE"] == "dropping", text
    assert reader["STATE"] == publisher["STATE"] == "-", text
    assert ", 1 dropping now  queued" in lines[1], text
    # Busiest publisher first (the default sort: msgs in, descending).
    assert rows[0] is publisher, text


def test_json_snapshot_of_a_real_bus(busy: tuple[Bus, Traffic]) -> None:
    bus, traffic = busy
    done = top("--metrics", f"127.0.0.1:{bus.port}", "--json", "--sort", "queued_messages")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (view,) = doc["buses"]
    assert view["error"] is None and view["server"]["instance"] == "the-master"
    assert view["server"]["role"] == "master" and view["total"] == 3
    clients = view["clients"]
    assert clients[0]["queued_messages"] > 0  # sorted by queue depth: the stalled one first
    assert clients[0]["drops_per_s"] > 0 and clients[0]["dropping"] is True
    assert view["totals"]["dropping"] == 1
    reader = next(c for c in clients if c["pid"] == traffic.reader.pid)
    assert reader["msgs_out_per_s"] > 10 and reader["bytes_out_per_s"] > 10 * len(PAYLOAD)
    assert view["totals"]["msgs_in_per_s"] > 10 and view["totals"]["dropped"] > 0


def test_grouped_by_user_sums_the_clients(busy: tuple[Bus, Traffic]) -> None:
    bus, _traffic = busy
    done = top("--metrics", f"127.0.0.1:{bus.port}", "--once", "--group", "uid")
    assert done.returncode == 0, done.stderr
    (lines,) = sections(done.stdout.decode()).values()
    assert lines[2].split()[:2] == ["UID", "CONNS"]
    (row,) = lines[3:]
    assert row.split()[:2] == [str(os.getuid()), "3"]


# --- the interactive view, in a real terminal --------------------------------------


class Tmux:
    """A private tmux server running one command in a 160x40 window."""

    def __init__(self, tmp_path: Path, command: str) -> None:
        # A socket of its own each time: a server just killed may still hold the last one.
        self.socket = str(tmp_path / f"tmux-{time.monotonic_ns()}.sock")
        # The exit status stays on screen after the command ends.
        self.run("new-session", "-d", "-x", "160", "-y", "40", f"{command}; echo EXIT=$?; sleep 60")

    def run(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, timeout=10)
        assert done.returncode == 0, f"tmux {args[0]}: {done.stderr.decode()}"
        return done.stdout.decode()

    def screen(self) -> str:
        return self.run("capture-pane", "-p")

    def wait_for(self, what: str, pattern: str) -> str:
        """The screen once ``pattern`` (a regex) shows on it."""
        last = [""]

        def check() -> bool:
            last[0] = self.screen()
            return re.search(pattern, last[0], re.MULTILINE) is not None

        try:
            wait_until(check, what, timeout=15)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{last[0]}") from None
        return last[0]

    def keys(self, *keys: str) -> None:
        self.run("send-keys", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux_available() -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the interactive view of `sbus-relay top` is NOT tested")


def test_interactive_view_in_a_terminal(
    busy: tuple[Bus, Traffic], tmp_path: Path, tmux_available: None
) -> None:
    bus, traffic = busy
    command = f"{VENV_BIN}/sbus-relay top --metrics 127.0.0.1:{bus.port} --metrics 127.0.0.1:1"
    term = Tmux(tmp_path, command)
    try:
        screen = term.wait_for(
            "a client row with rates", rf"^ +\d+ local .* {traffic.reader.pid} .* [0-9.]+[kM]? "
        )
        assert "sbus-relay top  2 buses  every 1s  sort msgs_in desc  group none" in screen
        assert re.search(rf"^the-master at 127.0.0.1:{bus.port}  role master  up ", screen, re.M)
        assert "127.0.0.1:1  down: connection refused" in screen  # and the view keeps running
        assert "CID RELAY" in screen and "IN/s*" in screen
        assert "q quit" in screen

        term.keys("g")  # grouped by relay label
        screen = term.wait_for("the view grouped by relay", r"^RELAY +CONNS ")
        assert re.search(r"^local +3 ", screen, re.M), screen
        assert "group relay" in screen

        term.keys("g")  # by user
        term.wait_for("the view grouped by uid", rf"^UID +CONNS .*\n{os.getuid()} +3 ")

        term.keys("s")  # the next sort column
        screen = term.wait_for("sorted by msgs out", r"sort msgs_out desc  group uid")
        term.keys("r", "+")
        term.wait_for("reversed, slower", r"every 2s  sort msgs_out asc")
        term.keys("<", "<", "-")
        term.wait_for("two columns back, faster", r"every 1s  sort patterns asc")

        # The bus goes away: its header says so, and the view keeps running.
        bus.process.stop()
        term.wait_for("the bus shown down", rf"^the-master at 127.0.0.1:{bus.port}  down: ")
        term.keys("g")
        term.wait_for("the view still answering keys", r"group none")

        term.keys("q")
        term.wait_for("top to exit with status 0", r"^EXIT=0$")
    finally:
        term.close()

    # Ctrl-C is a normal way out too: status 0, the terminal restored.
    term = Tmux(tmp_path, command)
    try:
        term.wait_for("the view", r"^127.0.0.1:1  down: connection refused$")
        term.keys("C-c")
        screen = term.wait_for("top to exit with status 0", r"^EXIT=0$")
        assert "Traceback" not in screen
    finally:
        term.close()


# --- a whole hierarchy -------------------------------------------------------------


def test_a_hierarchy_file_shows_every_bus_and_which_container_is_busy(tmp_path: Path) -> None:
    def no_metrics_for_relay_b(document: dict[str, Any]) -> None:
        for spec in document["buses"]:
            if spec["name"] == "relay-b":
                del spec["metrics"]

    up = Up(tmp_path, edit=no_metrics_for_relay_b)
    try:
        up.read_until(b"buses running")
        receiver = Peer(up.addresses["relay-b"])
        receiver.sub(b"demo/")
        sender = Peer(up.addresses["relay-a"])
        sideways(sender, receiver, b"demo/hello")  # the interest has reached relay-a
        stop = threading.Event()

        def publish() -> None:
            while not stop.is_set():
                sender.pub(b"demo/load", PAYLOAD)
                time.sleep(PUBLISH_PAUSE)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        try:
            done = top(str(up.config), "--once", "--group", "relay")
        finally:
            stop.set()
            thread.join(WAIT)
    finally:
        up.close()
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    found = sections(text)
    assert text.splitlines()[0].startswith("sbus-relay top  2 buses  "), text
    assert "role master" in found["master"][0], text
    assert "role relay" in found["relay-a"][0] and "upstream connected" in found["relay-a"][0]
    assert "no metrics address, not watched: relay-b" in text.splitlines(), text

    def groups(bus: str) -> dict[str, list[str]]:
        lines = found[bus]
        assert lines[2].split()[:2] == ["RELAY", "CONNS"], text
        return {line.split()[0]: line.split() for line in lines[3:]}

    # On the master, each container is one row under its relay's name.
    master = groups("master")
    assert rate(master["relay-a"][4]) > 10, text  # IN/s: relay-a sends the traffic up
    assert rate(master["relay-b"][5]) > 10, text  # OUT/s: relay-b's subscriber wants it
    assert master["relay-a"][1] == master["relay-b"][1] == "1", text  # CONNS
    assert master["relay-a"][2] == master["relay-b"][2] == "0", text  # DROPPING
    # On relay-a, its own publisher is a local client.
    assert rate(groups("relay-a")["local"][4]) > 10, text


# --- failures ----------------------------------------------------------------------


def test_a_bus_that_does_not_answer_is_a_header_line_not_an_error(tmp_path: Path) -> None:
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections, never answers
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        ports = [s.getsockname()[1] for s in (silent, closed)]
        # Not a terminal: one snapshot without --once.
        done = top(*(f"--metrics=127.0.0.1:{port}" for port in ports), "--interval", "0.2")
    assert done.returncode == 1 and done.stderr == b""  # no bus answered: scripts can tell
    lines = done.stdout.decode().splitlines()
    assert f"127.0.0.1:{ports[0]}  down: no answer within 2s" in lines
    assert f"127.0.0.1:{ports[1]}  down: connection refused" in lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name a hierarchy file or at least one --metrics HOST:PORT"),
        (("--metrics", "nowhere"), "--metrics: 'nowhere' is not HOST:PORT"),
        (("--metrics", "127.0.0.1:1", "--interval", "0"), "--interval: expected seconds"),
        (("--metrics", "127.0.0.1:1", "--interval", "soon"), "--interval: expected seconds"),
        (("--metrics", "127.0.0.1:1", "--sort", "colour"), "--sort: expected one of cid,"),
        (("--metrics", "127.0.0.1:1", "--group", "pid"), "--group: expected one of none,"),
        (("--metrics", "127.0.0.1:1", "--limit", "-3"), "--limit: expected a whole number"),
        (("/nonexistent/hierarchy.yaml",), "/nonexistent/hierarchy.yaml: (file): cannot read"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(args: tuple[str, ...], message: str) -> None:
    done = top(*args)
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("sbus-relay top: ") and message in line, line
    assert done.stdout == b""


def test_a_hierarchy_without_metrics_addresses_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "h.yaml"
    config.write_text("buses:\n  - name: master\n    address: /tmp/sbus-top-unused.sock\n")
    done = top(str(config))
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"sbus-relay top: {config}: buses: no bus has a metrics address to watch"
    ]
