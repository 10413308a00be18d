"""Signing in to NATS as a user expects: user and password, a token, TLS with
a CA file; wrong credentials leave the bus serving and the link down."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from sbus_relay.client import Client
from tests.nats.cluster import Host, NatsServer, wait_until
from tests.support import free_port

pytestmark = pytest.mark.timeout(90)


def host_with(tmp: Path, server: NatsServer, name: str, nats: dict[str, object]) -> Host:
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"nats": {"servers": ["nats://192.0.2.1:1"], **nats}}))
    # --nats names the servers and keeps the file's other settings
    return Host(tmp, name, server.url, "-C", str(config), relay=False)


def crossing(a: Host, b: Host) -> None:
    with Client(b.master.address, timeout=5) as sub, Client(a.master.address, timeout=5) as pub:
        sub.subscribe(b"auth/")
        wait_until(lambda: a.link()["remote_patterns"] >= 1, 15, "interest")
        for _ in range(50):  # until b's subscription is on NATS too
            pub.publish(b"auth/x", b"signed in")
            try:
                assert bytes(sub.receive(timeout=0.2).payload) == b"signed in"
                return
            except TimeoutError:
                continue
        raise AssertionError("nothing crossed")


@pytest.mark.parametrize(
    ("server_args", "good", "bad"),
    [
        (("--user", "bus", "--pass", "s3cret"), {"user": "bus", "password": "s3cret"},
         {"user": "bus", "password": "wrong"}),
        (("--auth", "t0ken"), {"token": "t0ken"}, {"token": "nope"}),
    ],
    ids=["user-password", "token"],
)  # fmt: skip
def test_credentials(
    tmp_path: Path, server_args: tuple[str, ...], good: dict[str, str], bad: dict[str, str]
) -> None:
    server = NatsServer(tmp_path, "auth", free_port(), free_port(), [], server_args)
    hosts = []
    try:
        hosts = [host_with(tmp_path, server, n, good) for n in ("hosta", "hostb")]
        wait_until(lambda: all(h.link()["connected"] for h in hosts), 20, "signed in")
        crossing(*hosts)
        refused = host_with(tmp_path, server, "hostc", bad)
        hosts.append(refused)
        with Client(refused.master.address, timeout=5) as c:  # serves its own clients
            c.subscribe(b"local/")
            c.publish(b"local/x", b"here")
            assert bytes(c.receive(timeout=5).payload) == b"here"
        assert not refused.link()["connected"]
        assert "nats: down" in refused.healthz()
    finally:
        for h in hosts:
            h.stop()
        server.stop()


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    ca_key, ca, key, csr, cert = (
        tmp_path / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem")
    )
    ext = tmp_path / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=sbus test CA",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    server = NatsServer(
        tmp_path, "tls", free_port(), free_port(), [],
        ("--tls", "--tlscert", str(cert), "--tlskey", str(key)), scheme="tls",
    )  # fmt: skip
    hosts = []
    try:
        hosts = [host_with(tmp_path, server, n, {"tls_ca": str(ca)}) for n in ("hosta", "hostb")]
        wait_until(lambda: all(h.link()["connected"] for h in hosts), 20, "joined over TLS")
        crossing(*hosts)
        # a reload keeps the link as it is: no reconnect, the traffic goes on
        a = hosts[0]
        a.master.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "config.reloaded" in a.master.stderr_text(), 10, "reloaded")
        assert a.link()["connected"] and a.link()["reconnects"] == 0
        crossing(*hosts)
    finally:
        for h in hosts:
            h.stop()
        server.stop()
