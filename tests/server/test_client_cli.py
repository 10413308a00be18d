"""The Client API and the command line against real server processes (docs/protocol.md)."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from sbus_relay.client import Client
from sbus_relay.ops.metrics_server import BUSY_HINT
from sbus_relay.protocol.errors import BusClosed, UsageError
from tests.support import (
    VENV_BIN,
    BusProcess,
    free_port,
    is_listening,
    run_cli,
    running,
    start_bus,
    wait_for_text,
)

pytestmark = pytest.mark.timeout(60)

#: Seconds any single wait in these tests may take.
WAIT = 15.0
ABSTRACT_RE = re.compile(r"^/dev/unix/abstract/00[0-9a-f]{214}$")


class Subscriber:
    """``sbus-relay sub ...`` in the background, started once it has subscribed."""

    def __init__(self, tmp_path: Path, address: str, *args: str) -> None:
        self.err = str(tmp_path / f"sub-{time.monotonic_ns()}.err")
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbus-relay"), "sub", "-v", "-a", address, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        wait_for_text(self.err, "subscribed to ", WAIT, self.proc)

    def finish(self) -> tuple[int, bytes]:
        try:
            out, _ = self.proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"sub did not finish; printed {out!r}") from None
        return self.proc.returncode, out


def pub(address: str, key: str, *payload: str, data: bytes | None = None) -> None:
    done = run_cli("pub", "-a", address, key, *payload, input=data)
    assert done.returncode == 0, done.stderr


# --- pub / sub ----------------------------------------------------------------------


def test_pub_sub_round_trip(sbusd: BusProcess, tmp_path: Path) -> None:
    sub = Subscriber(tmp_path, sbusd.address, "a/*", "z", "--count", "3")
    pub(sbusd.address, "a/b", "hello world")
    pub(sbusd.address, "nope", "not for us")
    pub(sbusd.address, "z", "-", data=b"tab\there\nnul\0bin\xff\\ \xc3\xa9")
    pub(sbusd.address, "a/c", "-n")  # an empty payload, asked for
    status, out = sub.finish()
    assert status == 0
    assert out.decode("utf-8").splitlines() == [
        "a/b\thello world",
        "z\ttab\\there\\nnul\\0bin\\xff\\\\ é",
        "a/c\t",
    ]


def test_sub_json(sbusd: BusProcess, tmp_path: Path) -> None:
    sub = Subscriber(tmp_path, sbusd.address, "", "--json", "--count", "2")
    pub(sbusd.address, "k/1", "héllo")
    pub(sbusd.address, "k/2", "-", data=b"\xff\x00\x01")
    status, out = sub.finish()
    assert status == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [
        {"key": "k/1", "payload": "héllo", "encoding": "utf-8"},
        {"key": "k/2", "payload": base64.b64encode(b"\xff\x00\x01").decode(), "encoding": "base64"},
    ]


def test_sub_count_stops_after_n(sbusd: BusProcess, tmp_path: Path) -> None:
    sub = Subscriber(tmp_path, sbusd.address, "x", "--count", "1")
    for n in range(3):
        pub(sbusd.address, "x", str(n))
    status, out = sub.finish()
    assert (status, out) == (0, b"x\t0\n")


def test_address_from_the_environment(sbusd: BusProcess) -> None:
    with Client(sbusd.address, timeout=WAIT) as client:
        client.subscribe("env")
        client.whoami()
        env = {**os.environ, "SBUS_ADDRESS": sbusd.address}
        done = run_cli("pub", "env", "via SBUS_ADDRESS", env=env)
        assert done.returncode == 0, done.stderr
        assert client.receive().payload == b"via SBUS_ADDRESS"


def test_pub_and_sub_without_a_bus_fail_clearly(short_tmp: Path) -> None:
    absent = str(short_tmp / "absent")
    for args in (("pub", "-a", absent, "k", "v"), ("sub", "-a", absent, "k")):
        done = run_cli(*args)
        assert done.returncode == 1
        assert b"cannot connect" in done.stderr


def test_an_empty_address_is_refused_not_taken_for_the_default(
    sbusd: BusProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SBUS_ADDRESS", sbusd.address)  # a bus the fallback would reach
    for args in (("pub", "-a", "", "k", "v"), ("sub", "-a", "", "k")):
        done = run_cli(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().endswith(b"empty address"), done.stderr


def test_an_empty_sbus_address_is_refused_not_taken_for_the_default(sbusd: BusProcess) -> None:
    env = {**os.environ, "SBUS_ADDRESS": ""}  # set, but empty: a mistake, not "the default"
    for args in (("pub", "k", "v"), ("sub", "k"), ("record", "--count", "1")):
        done = run_cli(*args, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.decode().splitlines() == [
            f"sbus-relay {args[0]}: $SBUS_ADDRESS is set but empty: unset it, or set it to"
            " the bus's address"
        ]


def test_pub_refuses_a_payload_over_the_packet_limit(sbusd: BusProcess) -> None:
    done = run_cli("pub", "-a", sbusd.address, "k", "-", input=b"x" * 409_600)
    assert done.returncode == 1
    assert b"limit" in done.stderr


def test_pub_refuses_a_reserved_key_the_bus_would_drop(sbusd: BusProcess) -> None:
    for key in ("!/x", "a/!/b"):
        done = run_cli("pub", "-a", sbusd.address, key, "v")
        assert done.returncode == 2, done.stderr
        assert done.stderr.count(b"\n") == 1 and b"reserved '!'" in done.stderr
    # A secret key, and '!' inside a segment, are ordinary publishes.
    for key in ("!/cred/0/0/1/x", "a/!x"):
        done = run_cli("pub", "-a", sbusd.address, key, "v")
        assert done.returncode == 0, done.stderr


# --- the Client API ----------------------------------------------------------------------


def test_whoami_buffers_messages_that_arrive_first(sbusd: BusProcess) -> None:
    with Client(sbusd.address, timeout=WAIT) as client:
        client.subscribe("")
        client.publish("mine", "first")
        credentials = client.whoami()
        assert re.fullmatch(rf"!/cred/{os.getgid()}/{os.getuid()}/{os.getpid()}", credentials)
        assert client.buffered == 1
        message = client.receive()
        assert (message.control, message.key, message.payload) == (False, b"mine", b"first")
        assert message.packet == b"MSG mine\0first"


def test_receive_times_out(sbusd: BusProcess) -> None:
    with Client(sbusd.address) as client:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            client.receive(timeout=0.2)
        assert time.monotonic() - start >= 0.2


def test_iter_messages_ends_when_the_bus_stops(sbusd: BusProcess) -> None:
    with Client(sbusd.address, timeout=WAIT, reconnect=False) as client:
        client.subscribe("k")
        client.publish("k", "one")
        client.whoami()
        assert sbusd.stop() == 0
        assert [m.payload for m in client.iter_messages()] == [b"one"]
        with pytest.raises((BusClosed, UsageError)):
            client.receive()


def test_client_refuses_bad_use(sbusd: BusProcess) -> None:
    client = Client(sbusd.address, timeout=WAIT)
    with pytest.raises(UsageError):
        client.flood("blocking/soft/maybe")
    with pytest.raises(UsageError):
        client.publish("k", b"x" * 409_600)
    client.close()
    client.close()  # idempotent
    with pytest.raises(UsageError):
        client.publish("k", "v")


def test_cooperative_clients_share_one_thread(sbusd: BusProcess) -> None:
    import gevent

    with Client(sbusd.address, timeout=WAIT, cooperative=True) as receiver:
        receiver.subscribe("co")
        receiver.whoami()
        waiting = gevent.spawn(receiver.receive)
        gevent.sleep(0.05)
        assert not waiting.ready()  # blocked in receive without blocking us
        with Client(sbusd.address, timeout=WAIT, cooperative=True) as sender:
            sender.publish("co", "op")
        assert waiting.get(timeout=WAIT).payload == b"op"


# --- serving: addresses, signals, flags ----------------------------------------------------


def test_abstract_address_is_printed_and_connectable(tmp_path: Path) -> None:
    with start_bus(tmp_path, "-a", "/dev/unix/abstract") as bus:
        assert ABSTRACT_RE.match(bus.address), bus.address
        with Client(bus.address, timeout=WAIT) as client:
            client.subscribe("k")
            client.publish("k", "v")
            assert client.receive().payload == b"v"


def test_fd_listener_is_adopted_and_made_to_listen(tmp_path: Path, short_tmp: Path) -> None:
    path = str(short_tmp / "inherited")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound.bind(path)  # bound, deliberately not listening
    fd = bound.fileno()
    try:
        with start_bus(tmp_path, "-a", f"/dev/fd/{fd}", pass_fds=[fd]) as bus:
            assert bus.address == path
            bound.close()  # only the server holds it now
            with Client(path, timeout=WAIT) as client:
                assert client.whoami().startswith("!/cred/")
            assert bus.stop() == 0
        # Not ours: the server must not remove a socket file it did not create.
        assert os.path.exists(path)
    finally:
        bound.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_stop_cleanly_and_remove_the_socket(tmp_path: Path, sig: int) -> None:
    bus = start_bus(tmp_path)
    assert os.path.exists(bus.address)
    assert bus.stop(sig) == 0
    assert not os.path.exists(bus.address)


def test_exit_when_empty(tmp_path: Path) -> None:
    for command, flag in (("sbusd", "-c"), ("serve", "-c")):
        bus = start_bus(tmp_path, flag, command=command)
        Client(bus.address).close()
        assert bus.proc.wait(WAIT) == 0, bus.stderr_text()
        assert not os.path.exists(bus.address)
        bus.stop()


def test_socket_mode_flags(tmp_path: Path) -> None:
    for flags, mode in (((), 0o700), (("-g",), 0o770), (("-o",), 0o707), (("-go",), 0o777)):
        with start_bus(tmp_path, *flags) as bus:
            assert stat.S_IMODE(os.stat(bus.address).st_mode) == mode, flags


def test_stale_socket_needs_r(tmp_path: Path, short_tmp: Path) -> None:
    path = str(short_tmp / "stale")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(path)
    dead.close()
    refused = subprocess.run(
        [os.path.join(VENV_BIN, "sbusd"), "-f", "-a", path],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.decode().count("\n") == 1
    assert "already exists" in refused.stderr.decode()
    with start_bus(tmp_path, "-r", "-a", path) as bus, Client(bus.address, timeout=WAIT) as c:
        assert c.whoami()


def test_a_live_socket_is_named_running_not_stale(tmp_path: Path) -> None:
    with start_bus(tmp_path) as bus:
        refused = run_cli("serve", "-f", "-a", bus.address)
        assert refused.returncode == 2
        assert refused.stderr.decode().splitlines() == [
            f"sbus-relay serve: a bus is already running on {bus.address}"
        ]
        with Client(bus.address, timeout=WAIT) as c:  # untouched
            assert c.whoami()


def test_serve_reads_the_config_and_flags_override_it(tmp_path: Path, short_tmp: Path) -> None:
    config = tmp_path / "bus.yaml"
    config.write_text(
        f"address: {short_tmp / 'from-file'}\ngroup_access: true\ninstance: from-file\n"
    )
    with start_bus(tmp_path, "-C", str(config), "--no-group-access", command="serve") as bus:
        # start_bus passed -a: the flag wins over the file's address
        assert not os.path.exists(short_tmp / "from-file")
        assert stat.S_IMODE(os.stat(bus.address).st_mode) == 0o700
        Client(bus.address).close()
        # ... and the file's other keys still apply (the instance names every log line)
        wait_for_text(bus.stderr_path, '"instance": "from-file"', WAIT, bus.proc)


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("hard_limit_bytes: 16 potatoes\n", "hard_limit_bytes"),
        ("nonsense: true\n", "nonsense"),
        ("max_clients: -1\n", "max_clients"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path: Path, yaml_text: str, key: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    done = run_cli("serve", "-f", "-C", str(config), "-a", str(tmp_path / "never"))
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert str(config) in lines[0] and key in lines[0]
    assert not (tmp_path / "never").exists()


def test_a_mistyped_config_key_is_one_line_suggesting_the_known_one(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("max_clent: 5\n")
    done = run_cli("serve", "-f", "-C", str(config), "-a", str(tmp_path / "never"))
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith(
        f"sbus-relay serve: {config}: max_clent: unknown key; did you mean 'max_clients'?"
    ), line
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("port", ["99999", "65536", "1" + "0" * 40])
def test_a_metrics_port_out_of_range_says_so(tmp_path: Path, port: str) -> None:
    done = run_cli("serve", "-f", "-a", str(tmp_path / "never"), "--metrics", f"127.0.0.1:{port}")
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("sbus-relay serve: command line: --metrics: port "), line
    assert line.endswith(" is out of range (1 to 65535)") and len(line) < 120, line
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("flag", ["--max-clients", "--hard-limit-bytes"])
def test_a_number_past_any_limit_is_one_line(tmp_path: Path, flag: str) -> None:
    done = run_cli("serve", "-f", "-a", str(tmp_path / "never"), flag, "9" * 5000)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"sbus-relay serve: command line: {flag}: must be at most 4611686018427387904"
    ]


def test_bad_flag_value_exits_2_naming_the_flag(tmp_path: Path) -> None:
    done = run_cli("serve", "-f", "-a", str(tmp_path / "never"), "--hard-limit-bytes", "lots")
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "sbus-relay serve: command line: --hard-limit-bytes: 'lots' is not a size "
        "(an integer, or e.g. 64KiB; B/KiB/MiB/GiB)"
    ]


@pytest.mark.parametrize("argv", [["-x"], ["-f", "-p", "/tmp/p"], ["--version"], ["extra"]])
def test_sbusd_takes_only_the_reference_flags(argv: list[str]) -> None:
    done = subprocess.run(
        [os.path.join(VENV_BIN, "sbusd"), *argv],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert b"usage: sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]" in done.stderr


def test_sbusd_combined_short_flags(tmp_path: Path, short_tmp: Path) -> None:
    path = str(short_tmp / "bus")
    with start_bus(tmp_path, "-gcra" + path) as bus:
        assert bus.address == path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o770
        Client(path).close()
        assert bus.proc.wait(WAIT) == 0  # -c took effect too


def test_sbusd_daemon_writes_and_removes_the_pid_file(tmp_path: Path, short_tmp: Path) -> None:
    directory = str(short_tmp)
    path, pidfile = os.path.join(directory, "bus"), os.path.join(directory, "pid")
    with open(tmp_path / "daemon.err", "wb") as err:  # a file: the daemon keeps stderr
        started = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", pidfile],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            timeout=WAIT, check=False,
        )  # fmt: skip
    log = (tmp_path / "daemon.err").read_text()
    assert started.returncode == 0, log
    # The parent exits only once the daemon is ready: no waiting needed here.
    pid = int(Path(pidfile).read_text())
    try:
        assert running(pid)
        assert is_listening(path)
        with Client(path, timeout=WAIT) as client:
            assert client.whoami().startswith("!/cred/")
        with open(f"/proc/{pid}/stat") as stat_file:  # detached: its own session
            fields = stat_file.read().rsplit(")", 1)[1].split()
        assert int(fields[3]) != os.getsid(0)
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WAIT
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running(pid)
    assert not os.path.exists(pidfile)
    assert not os.path.exists(path)
    os.rmdir(directory)


def test_sbusd_daemon_reports_a_bad_pid_file(tmp_path: Path, short_tmp: Path) -> None:
    path = str(short_tmp / "bus")
    with open(tmp_path / "daemon.err", "wb") as err:
        started = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", "/nonexistent/dir/pid"],
            stdin=subprocess.DEVNULL, stderr=err, timeout=WAIT, check=False,
        )  # fmt: skip
    assert started.returncode == 1
    assert "pid file" in (tmp_path / "daemon.err").read_text()
    deadline = time.monotonic() + WAIT
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(path)


def test_systemd_socket_activation(tmp_path: Path, short_tmp: Path) -> None:
    path = str(short_tmp / "activated")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound.bind(path)
    bound.listen()
    # As systemd does it: the socket is descriptor 3 and LISTEN_PID is the server's.
    script = f'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -f 3<&{bound.fileno()}'
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-c", script, os.path.join(VENV_BIN, "sbusd")],
            pass_fds=(bound.fileno(),), stdin=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    bound.close()
    try:
        with Client(path, timeout=WAIT) as client:
            assert client.whoami().startswith("!/cred/")
        # It did not fall back to the default address.
        assert "/run/sbus.socket" not in (tmp_path / "err").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0, (tmp_path / "err").read_text()
    assert os.path.exists(path)  # systemd's socket: not ours to remove


def test_serve_with_metrics(tmp_path: Path) -> None:
    import urllib.request

    port = free_port()
    with start_bus(tmp_path, "--metrics", f"127.0.0.1:{port}", command="serve") as bus:
        Client(bus.address).close()
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as r:
                    body = r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert "sbus_" in body


def test_client_sends_and_receives_the_largest_legal_packet(sbusd: BusProcess) -> None:
    """protocol.md: packets up to 409,600 bytes are legal, in both directions.

    A SEQPACKET send larger than the socket's send buffer fails with EMSGSIZE,
    and the default buffer is about half this size, so the client must ask for
    a bigger one (as the server does for its side).
    """
    payload = bytes(range(256)) * 1600  # 409,600 bytes, minus the header below
    payload = payload[: 409_600 - len(b"MSG big\0")]
    with Client(sbusd.address, timeout=10) as sub, Client(sbusd.address, timeout=10) as pub:
        sub.subscribe(b"big")
        sub.whoami()  # the subscription is in place
        pub.publish(b"big", payload)
        got = sub.receive()
    assert len(got.packet) == 409_600
    assert got.payload == payload


def test_a_config_nested_thousands_deep_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text("address: " + "[" * 5000 + "]" * 5000 + "\n")
    done = run_cli("serve", "-f", "-C", str(config))
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "nested too deeply" in lines[0]


def test_a_busy_metrics_port_is_one_line_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        address = tmp_path / "bus"
        done = run_cli("serve", "-f", "-a", str(address), "--metrics", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"sbus-relay serve: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        + BUSY_HINT
    ]
    assert not address.exists()  # the bus never listened


def test_a_second_start_of_the_same_bus_says_it_is_running(tmp_path: Path) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    with start_bus(tmp_path, "--metrics", metrics, command="serve") as bus:
        done = run_cli("serve", "-f", "-a", bus.address, "--metrics", metrics)
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            f"sbus-relay serve: a bus is already running on {bus.address} "
            f"(and cannot serve metrics on {metrics}: Address already in use{BUSY_HINT})"
        ]
        assert os.path.exists(bus.address)  # the running bus keeps its socket
