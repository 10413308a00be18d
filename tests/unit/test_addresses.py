"""addresses: every protocol.md form, on real sockets (no server needed)."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbus_relay.ops.addresses import (
    LOCK_SUFFIX,
    Address,
    connect,
    format_abstract,
    listen,
    parse_address,
    printable_name,
)
from sbus_relay.protocol.errors import AddressError
from tests.support import short_dir

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    import shutil

    path = short_dir()
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def is_listening(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


# --- parsing ---------------------------------------------------------------------


def test_parse_path() -> None:
    assert parse_address("/run/sbus.socket") == Address("path", path="/run/sbus.socket")
    assert parse_address("rel/sock") == Address("path", path="rel/sock")


def test_parse_random_abstract() -> None:
    address = parse_address("/dev/unix/abstract")
    assert (address.kind, address.name) == ("abstract", None)
    assert str(address) == "/dev/unix/abstract"


def test_parse_abstract_hex_is_the_whole_padded_sun_path() -> None:
    full = (b"\0hello").ljust(108, b"\0")
    assert parse_address("/dev/unix/abstract/" + full.hex()).name == full
    # A shorter hex means the same name: the rest of sun_path is NUL padding.
    assert parse_address("/dev/unix/abstract/0068656c6c6f").name == full
    assert str(parse_address("/dev/unix/abstract/0068656c6c6f")) == format_abstract(full)


def test_parse_fd() -> None:
    assert parse_address("/dev/fd/7") == Address("fd", fd=7)
    assert str(Address("fd", fd=7)) == "/dev/fd/7"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("/tmp/a\0b", "NUL"),
        ("/dev/unix/abstract/zz", "not hexadecimal"),
        ("/dev/unix/abstract/001", "not hexadecimal"),
        ("/dev/unix/abstract/6162", "start with 00"),
        ("/dev/unix/abstract/" + "00" * 109, "sun_path holds 108"),
        ("/dev/fd/x", "descriptor number"),
        ("/dev/fd/", "descriptor number"),
        ("/dev/fd/-1", "descriptor number"),
        ("/tmp/" + "x" * 104, "longer than 108"),
    ],
)
def test_bad_addresses_are_clear_errors(text: str, words: str) -> None:
    with pytest.raises(AddressError, match=words):
        parse_address(text)


def test_format_abstract_pads_to_108_bytes() -> None:
    text = format_abstract(b"\0x")
    assert text == "/dev/unix/abstract/0078" + "00" * 106
    assert parse_address(text).name == b"\0x".ljust(108, b"\0")
    with pytest.raises(AddressError):
        format_abstract(b"x")


# --- listening on paths -------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "expected"), [(0o700, 0o700), (0o770, 0o770), (0o707, 0o707), (0o777, 0o777)]
)
def test_listen_path_sets_the_mode(sockdir: Path, mode: int, expected: int) -> None:
    path = sockdir / "bus"
    sock, printable = listen(parse_address(str(path)), mode=mode)
    try:
        info = os.stat(path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == expected
        assert printable == str(path)
        assert (sock.family, sock.type) == (socket.AF_UNIX, socket.SOCK_SEQPACKET)
        assert is_listening(sock)
        connect(str(path)).close()
    finally:
        sock.close()


def test_listen_refuses_an_existing_path_without_remove_stale(sockdir: Path) -> None:
    path = sockdir / "bus"
    path.write_text("not a socket")
    with pytest.raises(AddressError, match="already exists"):
        listen(parse_address(str(path)))
    assert path.read_text() == "not a socket"


@pytest.mark.parametrize("remove_stale", [False, True])
def test_a_directory_at_the_path_is_named_as_one(sockdir: Path, remove_stale: bool) -> None:
    path = sockdir / "dir"
    path.mkdir()
    expected = f"{path} is a directory, not a socket path: give a file name in it"
    with pytest.raises(AddressError, match=expected):
        listen(parse_address(str(path)), remove_stale=remove_stale)
    assert path.is_dir()
    assert not (sockdir / ("dir" + LOCK_SUFFIX)).exists()


def test_remove_stale_removes_a_dead_socket(sockdir: Path) -> None:
    path = sockdir / "bus"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(path))
    dead.close()  # the file stays behind: stale
    sock, _ = listen(parse_address(str(path)), remove_stale=True)
    try:
        connect(str(path)).close()
    finally:
        sock.close()


def test_remove_stale_keeps_a_live_socket(sockdir: Path) -> None:
    path = sockdir / "bus"
    live, _ = listen(parse_address(str(path)))
    try:
        with pytest.raises(AddressError, match="in use"):
            listen(parse_address(str(path)), remove_stale=True)
        connect(str(path)).close()  # still answering
    finally:
        live.close()


def test_remove_stale_removes_any_other_file_with_a_warning(sockdir: Path) -> None:
    # As the reference sbusd -r does: whatever is at the path goes.
    path = sockdir / "bus"
    path.write_text("data")
    warnings: list[str] = []
    sock, _ = listen(parse_address(str(path)), remove_stale=True, warn=warnings.append)
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert warnings == [f"removed {path}, which was not a socket"]
    finally:
        sock.close()


def test_remove_stale_leaves_no_lock_file_behind(sockdir: Path) -> None:
    path = sockdir / "bus"
    sock, _ = listen(parse_address(str(path)), remove_stale=True)
    sock.close()
    assert not (sockdir / ("bus" + LOCK_SUFFIX)).exists()


def test_a_lock_file_removed_while_waiting_for_it_is_not_trusted(sockdir: Path) -> None:
    # A taker that waited on a lock file its holder then removed must lock the
    # file now at the path, or two takers could hold "the" lock at once.
    path = sockdir / "bus"
    lock_path = str(path) + LOCK_SUFFIX
    first = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(first, fcntl.LOCK_EX)
    second = -1
    taken: list[socket.socket] = []
    waiter = threading.Thread(
        target=lambda: taken.append(listen(parse_address(str(path)), remove_stale=True)[0])
    )
    waiter.start()
    try:
        time.sleep(0.3)  # the waiter has opened the first file and waits for its lock
        assert not taken
        os.unlink(lock_path)  # the holder is done: it removes the file ...
        second = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(second, fcntl.LOCK_EX)  # ... and a newcomer locks a fresh one
        fcntl.flock(first, fcntl.LOCK_UN)
        time.sleep(0.3)
        assert not taken, "the waiter bound while the newcomer held the lock"
        fcntl.flock(second, fcntl.LOCK_UN)
        waiter.join(10)
        assert taken and not os.path.exists(lock_path)
    finally:
        os.close(first)
        if second >= 0:
            os.close(second)
        for sock in taken:
            sock.close()


def test_relative_paths_print_absolute(sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(sockdir)
    sock, printable = listen(parse_address("bus"))
    try:
        assert printable == str(sockdir / "bus")
    finally:
        sock.close()


def test_connect_to_nothing_is_an_address_error(sockdir: Path) -> None:
    with pytest.raises(AddressError, match="cannot connect"):
        connect(str(sockdir / "absent"))


# --- abstract names -------------------------------------------------------------------


def test_random_abstract_prints_a_connectable_108_byte_name() -> None:
    sock, printable = listen(parse_address("/dev/unix/abstract"))
    try:
        hex_part = printable.removeprefix("/dev/unix/abstract/")
        assert len(hex_part) == 216 and hex_part.startswith("00")
        assert printable_name(sock) == printable
        client = connect(printable)
        server_side, _ = sock.accept()
        client.send(b"MSG a\0b")
        assert server_side.recv(100) == b"MSG a\0b"
        client.close()
        server_side.close()
    finally:
        sock.close()


def test_two_random_abstract_names_differ() -> None:
    first, a = listen(parse_address("/dev/unix/abstract"))
    second, b = listen(parse_address("/dev/unix/abstract"))
    first.close()
    second.close()
    assert a != b


def test_abstract_names_are_the_padded_108_bytes() -> None:
    # Linux compares abstract names by length too: a client that connected with
    # the short name would miss a server bound with the padded one.
    sock, printable = listen(parse_address("/dev/unix/abstract/00736275732d74657374"))
    try:
        name = sock.getsockname()
        assert isinstance(name, bytes) and len(name) == 108
        short = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with pytest.raises(ConnectionRefusedError):
            short.connect(b"\0sbus-test")
        short.close()
        connect(printable).close()
    finally:
        sock.close()


def test_connecting_to_random_abstract_is_an_error() -> None:
    with pytest.raises(AddressError, match="picks a name"):
        connect("/dev/unix/abstract")


# --- inherited descriptors --------------------------------------------------------------


def test_fd_listener_that_is_not_listening_is_made_to_listen(sockdir: Path) -> None:
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound.bind(str(sockdir / "bus"))
    assert not is_listening(bound)
    sock, printable = listen(parse_address(f"/dev/fd/{bound.fileno()}"))
    try:
        assert sock.fileno() == bound.fileno()
        assert is_listening(sock)
        assert printable == str(sockdir / "bus")
        connect(str(sockdir / "bus")).close()
    finally:
        bound.detach()
        sock.close()


def test_fd_of_a_stream_socket_is_refused() -> None:
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(AddressError, match="SOCK_SEQPACKET"):
            listen(parse_address(f"/dev/fd/{stream.fileno()}"))
        stream.getsockname()  # still open: refusing did not close it
    finally:
        stream.close()


def test_fd_that_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as plain:
        with pytest.raises(AddressError, match="not an open socket"):
            listen(parse_address(f"/dev/fd/{plain.fileno()}"))
        plain.write("still open")


def test_connect_to_an_inherited_connected_fd() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock = connect(f"/dev/fd/{left.fileno()}")
    left.detach()
    sock.send(b"MSG a\0b")
    assert right.recv(100) == b"MSG a\0b"
    sock.close()
    right.close()


# --- systemd socket activation -----------------------------------------------------------

_SYSTEMD_CHILD = """
import os, socket, sys
from sbus_relay.ops.addresses import printable_name, systemd_listeners
os.environ["LISTEN_PID"] = sys.argv[1] if sys.argv[1] != "self" else str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
found = systemd_listeners()
print(len(found), "LISTEN_FDS" in os.environ)
for sock in found:
    print(printable_name(sock), sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
"""


def _run_systemd_child(sock: socket.socket, listen_pid: str) -> list[str]:
    # The socket must be descriptor 3 in the child, as systemd passes it.
    script = f'exec "$0" -c "$1" "$2" 3<&{sock.fileno()}'
    done = subprocess.run(
        ["bash", "-c", script, sys.executable, _SYSTEMD_CHILD, listen_pid],
        pass_fds=(sock.fileno(),),
        capture_output=True,
        timeout=20,
        check=True,
        text=True,
    )
    return done.stdout.splitlines()


def test_systemd_listeners_adopt_fd_3_and_clear_the_environment(sockdir: Path) -> None:
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound.bind(str(sockdir / "bus"))
    try:
        assert _run_systemd_child(bound, "self") == ["1 False", f"{sockdir / 'bus'} 1"]
    finally:
        bound.close()


def test_systemd_listeners_for_another_pid_are_ignored(sockdir: Path) -> None:
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound.bind(str(sockdir / "bus"))
    try:
        assert _run_systemd_child(bound, "1") == ["0 False"]
    finally:
        bound.close()
