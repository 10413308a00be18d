"""The ``sbusd`` command as a drop-in for the reference daemon (docs/protocol.md)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.server.rawclient import (
    RawClient,
    connect_address,
    wait_accepting,
)
from tests.support import VENV_BIN, is_listening, running, start_bus

pytestmark = pytest.mark.timeout(30)

NOBODY = 65534
#: Seconds the child of ``whoami_as_nobody`` waits for the answer: a bus that has
#: just begun to listen may still be importing what serves (seconds, on a loaded
#: machine); a refusal is a reset or an end of file, not a silence.
ANSWER_WAIT = 10.0


def pubsub_works(address: str | bytes) -> None:
    """A subscriber gets a publisher's message through ``address``."""
    with RawClient(address) as sub, RawClient(address) as pub:
        sub.sub(b"d/")
        sent = pub.pub(b"d/x", b"\0hello\xff")
        assert sub.recv_packet() == sent


# --- -c -------------------------------------------------------------------------


def test_c_exits_zero_once_the_last_client_has_gone(tmp_path: Path) -> None:
    bus = start_bus(tmp_path, "-c")
    try:
        first, second = RawClient(bus.address), RawClient(bus.address)
        first.sync()
        second.sync()
        first.close()
        # One client left: still serving.
        second.sync()
        assert bus.proc.poll() is None
        second.close()
        assert bus.proc.wait(10) == 0
        # As a user would expect from a clean exit: no stale socket file left.
        assert not os.path.exists(bus.address)
    finally:
        bus.stop(signal.SIGKILL)


def test_without_c_the_server_outlives_its_clients(tmp_path: Path) -> None:
    bus = start_bus(tmp_path)
    try:
        RawClient(bus.address).close()
        with RawClient(bus.address) as client:
            client.sync()
        with RawClient(bus.address) as client:
            assert client.whoami()
        assert bus.proc.poll() is None
    finally:
        assert bus.stop(signal.SIGTERM) == 0


# --- socket modes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "mode"),
    [((), 0o700), (("-g",), 0o770), (("-o",), 0o707), (("-go",), 0o777), (("-g", "-o"), 0o777)],
    ids=["default", "g", "o", "go", "g-o"],
)
def test_socket_mode(tmp_path: Path, flags: tuple[str, ...], mode: int) -> None:
    bus = start_bus(tmp_path, *flags)
    try:
        st = os.stat(bus.address)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == mode, oct(stat.S_IMODE(st.st_mode))
    finally:
        bus.stop(signal.SIGTERM)


# --- -u -------------------------------------------------------------------------


def whoami_as_nobody(address: str) -> str:
    """Fork a child that drops to uid/gid 65534 and asks whoami; report what happened."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only plain system calls, then _exit
        result = "child-error"
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = _probe_whoami(address)
        except BaseException as exc:
            result = f"child-error {exc!r}"
        finally:
            os.write(write_end, result.encode("latin-1"))
            os._exit(0)
    os.close(write_end)
    try:
        chunks = []
        deadline = time.monotonic() + ANSWER_WAIT + 5
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("latin-1")
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def _probe_whoami(address: str) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(ANSWER_WAIT)
    try:
        sock.connect(address)
    except OSError as exc:
        return f"connect-failed {exc.errno}"
    try:
        sock.send(b"CMSG !/cred/whoami")
        data = sock.recv(409_601)
    except TimeoutError:
        return "no-answer"
    except OSError as exc:
        return f"closed {exc.errno}"
    if not data:
        return "closed eof"
    return f"answer {os.getpid()} " + data.decode("latin-1")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid a child to 65534")
def test_u_refuses_other_users(tmp_path: Path) -> None:
    bus = start_bus(tmp_path, "-o", "-u", "root")
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)  # let uid 65534 reach the socket
        with RawClient(bus.address) as root_client:  # root is allowed
            assert root_client.whoami()
        result = whoami_as_nobody(bus.address)
        # Refused at accept: told why (when the notice is read before the reset), never answered.
        told = result.startswith("answer ") and result.endswith("CMSG disconnect\0user_not_allowed")
        assert told or result.startswith(("connect-failed", "closed", "no-answer")), result
        assert bus.proc.poll() is None
    finally:
        bus.stop(signal.SIGTERM)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid a child to 65534")
def test_without_u_other_users_connect(tmp_path: Path) -> None:
    # The control case of the test above: the same child gets in without -u.
    bus = start_bus(tmp_path, "-o")
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)
        result = whoami_as_nobody(bus.address)
        assert result.startswith("answer "), result
        _, child_pid, reply = result.split(" ", 2)
        assert reply == f"CMSG !/cred/whoami\0!/cred/{NOBODY}/{NOBODY}/{child_pid}"
    finally:
        bus.stop(signal.SIGTERM)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid a child to 65534")
def test_u_accepts_a_listed_uid(tmp_path: Path) -> None:
    # protocol.md: -u is repeatable, and takes a name or a uid.
    bus = start_bus(tmp_path, "-o", "-u", "root", "-u", str(NOBODY))
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)
        assert whoami_as_nobody(bus.address).startswith("answer "), bus.stderr_text()[-2000:]
    finally:
        bus.stop(signal.SIGTERM)


# --- signals --------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=str)
def test_signal_removes_socket_and_exits_zero(tmp_path: Path, sig: int) -> None:
    bus = start_bus(tmp_path)
    try:
        with RawClient(bus.address) as client:
            client.sub(b"x/")  # a connected client must not hold up the exit
            assert os.path.exists(bus.address)
            bus.proc.send_signal(sig)
            assert bus.proc.wait(10) == 0
        assert not os.path.exists(bus.address)
    finally:
        bus.stop(signal.SIGKILL)


#: How long after its start the next test's bus gets an alarm (the reference's
#: test program arms one second before it execs the daemon it tests; more here,
#: as the interpreter itself may take a second to start on a loaded machine).
INHERITED_ALARM = 3


def test_an_alarm_armed_before_exec_does_not_end_a_foreground_bus(short_tmp: Path) -> None:
    address = str(short_tmp / "bus")
    started = time.monotonic()
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "sbusd"), "-f", "-a", address],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.alarm(INHERITED_ALARM),
    )
    try:
        wait_accepting(address, proc)
        with RawClient(address) as client:
            client.sync()
            time.sleep(max(0.0, started + INHERITED_ALARM + 0.2 - time.monotonic()))
            client.sync()  # the alarm was due: a bus that answers now ran through it
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- addresses ------------------------------------------------------------------

ABSTRACT = "/dev/unix/abstract/"


def test_abstract_address_is_printed_and_works(tmp_path: Path) -> None:
    bus = start_bus(tmp_path, "-a", "/dev/unix/abstract")
    try:
        printed = bus.address
        assert printed.startswith(ABSTRACT), printed
        hex_name = printed[len(ABSTRACT) :]
        assert len(hex_name) == 216, hex_name
        name = bytes.fromhex(hex_name)
        assert name[0] == 0, "an abstract name starts with NUL"
        assert connect_address(printed) == name
        pubsub_works(name)
    finally:
        assert bus.stop(signal.SIGTERM) == 0


def test_given_abstract_address_works(tmp_path: Path) -> None:
    name = b"\0sbus-test-" + os.urandom(8).hex().encode()
    name = name.ljust(108, b"\0")
    bus = start_bus(tmp_path, "-a", ABSTRACT + name.hex())
    try:
        pubsub_works(name)
    finally:
        assert bus.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound-only"])
def test_inherited_fd_address(listening: bool, short_tmp: Path) -> None:
    directory = str(short_tmp)
    path = os.path.join(directory, "fd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    if listening:
        listener.listen(16)
    fd = listener.fileno()
    err_path = os.path.join(directory, "stderr")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [os.path.join(VENV_BIN, "sbusd"), "-f", "-a", f"/dev/fd/{fd}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=(fd,),
        )
    listener.close()  # only the server's copy is left
    try:
        wait_accepting(path, proc)
        pubsub_works(path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        status = proc.wait(10)
    assert status == 0, Path(err_path).read_text(errors="replace")[-2000:]


# --- -r and stale sockets -----------------------------------------------------


def stale_socket(short_tmp: Path) -> str:
    path = os.path.join(short_tmp, "stale.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: a stale socket
    return path


def test_r_removes_a_stale_socket(tmp_path: Path, short_tmp: Path) -> None:
    path = stale_socket(short_tmp)
    bus = start_bus(tmp_path, "-r", "-a", path)
    try:
        pubsub_works(path)
    finally:
        assert bus.stop(signal.SIGTERM) == 0


def test_without_r_a_stale_socket_is_not_clobbered(short_tmp: Path) -> None:
    # The reference sbusd fails to bind over an existing file without -r; a user
    # would expect a clear non-zero exit rather than a silent takeover.
    path = stale_socket(short_tmp)
    result = subprocess.run(
        [os.path.join(VENV_BIN, "sbusd"), "-f", "-a", path],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=15,
        check=False,
    )
    assert result.returncode != 0
    assert os.path.exists(path)


def test_r_does_not_take_over_a_live_bus(tmp_path: Path) -> None:
    # "-r remove a *stale* socket file": a user would expect a second server to
    # leave a live bus alone (fail), not steal its address.
    first = start_bus(tmp_path)
    try:
        result = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-f", "-r", "-a", first.address],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=15,
            check=False,
        )
        assert result.returncode != 0
        pubsub_works(first.address)
    finally:
        assert first.stop(signal.SIGTERM) == 0


def test_r_removes_a_regular_file_and_logs_a_warning(tmp_path: Path, short_tmp: Path) -> None:
    # As the reference's own test does: a plain file at the path goes with -r.
    path = os.path.join(short_tmp, "plain")
    Path(path).write_text("left behind")
    bus = start_bus(tmp_path, "-r", "-a", path)
    try:
        pubsub_works(path)
        assert "which was not a socket" in bus.stderr_text()
    finally:
        assert bus.stop(signal.SIGTERM) == 0


def test_r_checks_removes_and_binds_under_the_lock_beside_the_socket(
    tmp_path: Path, short_tmp: Path
) -> None:
    path = stale_socket(short_tmp)
    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    err_path = tmp_path / "sbusd.err"
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [os.path.join(VENV_BIN, "sbusd"), "-f", "-r", "-a", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            time.sleep(1.0)  # long enough to start; it must wait for the lock
            assert proc.poll() is None, err_path.read_text()
            assert not is_listening(path)
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            wait_accepting(path, proc, timeout=15)
            pubsub_works(path)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
    finally:
        os.close(lock_fd)
    assert not os.path.exists(path + ".lock")  # removed by the server once bound


def test_two_servers_started_with_r_on_one_stale_path_never_both_bind(
    tmp_path: Path, short_tmp: Path
) -> None:
    path = stale_socket(short_tmp)
    procs = []
    for i in range(4):
        with open(tmp_path / f"sbusd-{i}.err", "wb") as err:
            procs.append(
                subprocess.Popen(
                    [os.path.join(VENV_BIN, "sbusd"), "-f", "-r", "-a", path],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    try:
        wait_accepting(path, None, timeout=15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sum(p.poll() is None for p in procs) > 1:
            time.sleep(0.05)
        running = [p for p in procs if p.poll() is None]
        assert len(running) == 1, [p.returncode for p in procs]
        assert all(p.returncode == 2 for p in procs if p not in running)
        pubsub_works(path)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)


def test_h_prints_the_usage_and_every_flag() -> None:
    done = subprocess.run(
        [os.path.join(VENV_BIN, "sbusd"), "-h"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=15,
        check=False,
    )
    assert done.returncode == 0
    text = done.stdout.decode()
    assert text.startswith("usage: sbusd [-a ADDRESS] [-f | -p PIDFILE] [-u USER]... [-cgor]")
    for flag in ("-a ADDRESS", "-f ", "-p PIDFILE", "-u USER", "-c ", "-g ", "-o ", "-r "):
        assert f"  {flag}" in text, flag


# --- daemonising ------------------------------------------------------------------


def test_daemon_writes_pidfile_and_cleans_up_on_sigterm(short_tmp: Path) -> None:
    directory = str(short_tmp)
    path = os.path.join(directory, "bus")
    pidfile = os.path.join(directory, "sbusd.pid")
    err_path = os.path.join(directory, "stderr")
    # The daemon may keep stderr for its logs, so give it a file, not a pipe.
    with open(err_path, "wb") as err:
        result = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", pidfile],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=15,
            check=False,
        )
    assert result.returncode == 0, Path(err_path).read_text(errors="replace")[-2000:]
    pid = 0
    try:
        deadline = time.monotonic() + 10
        while not (os.path.exists(pidfile) and Path(pidfile).read_text().strip()):
            assert time.monotonic() < deadline, "no pid file"
            time.sleep(0.02)
        pid = int(Path(pidfile).read_text().strip())
        os.kill(pid, 0)  # alive
        wait_accepting(path, None)
        pubsub_works(path)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while os.path.exists(pidfile) or os.path.exists(path):
            assert time.monotonic() < deadline, "pid file or socket left behind"
            time.sleep(0.02)
        while running(pid):
            assert time.monotonic() < deadline, "daemon did not exit"
            time.sleep(0.02)
        pid = 0
    finally:
        if pid and running(pid):
            os.kill(pid, signal.SIGKILL)


def test_daemon_with_pidfile_dev_null_leaves_dev_null_alone(short_tmp: Path) -> None:
    # protocol.md: "/dev/null for none" -- and it must survive the daemon's cleanup.
    path = os.path.join(short_tmp, "bus")
    result = subprocess.run(
        [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", "/dev/null"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=15,
        check=False,
    )
    assert result.returncode == 0
    pid = _owner_of(path)
    try:
        pubsub_works(path)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while running(pid):
            assert time.monotonic() < deadline, "daemon did not exit"
            time.sleep(0.02)
        pid = 0
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
        assert not os.path.exists(path)
    finally:
        if pid and running(pid):
            os.kill(pid, signal.SIGKILL)


def _stop_pid_in(pidfile: str) -> None:
    """Stop the daemon named by ``pidfile``, if it is there (also after a failure)."""
    with contextlib.suppress(OSError, ValueError):
        _stop_daemon(int(Path(pidfile).read_text()))


def _stop_daemon(pid: int) -> None:
    """SIGTERM a daemon and wait until it is gone (SIGKILL after 10 s)."""
    if not running(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while running(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)


def test_a_daemon_lets_go_of_its_callers_pipes(short_tmp: Path) -> None:
    # `sbus-relay serve ... | tail -2` returns once the daemon is up: the daemon
    # keeps neither end of the caller's stdout nor its stderr.
    directory = str(short_tmp)
    path = os.path.join(directory, "bus")
    pidfile = os.path.join(directory, "bus.pid")
    serve = os.path.join(VENV_BIN, "sbus-relay")
    line = f"{serve} serve -a {path} -p {pidfile} --metrics 127.0.0.1:0 2>&1 | tail -2"
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", line],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,  # on a daemon that kept the pipe: never returns
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # its log is not the caller's: only serve's one line of where it went
        assert done.stderr == b"" and done.stdout.startswith(b"sbus-relay serve: in the back")
        assert len(done.stdout.splitlines()) == 1, done.stdout
        pubsub_works(path)
    finally:
        _stop_pid_in(pidfile)


def test_a_daemon_logs_to_its_log_file_not_to_its_caller(tmp_path: Path, short_tmp: Path) -> None:
    # Without --log-file its log goes to syslog (the journal), with it to the file.
    directory = str(short_tmp)
    path = os.path.join(directory, "bus")
    pidfile = os.path.join(directory, "bus.pid")
    log = tmp_path / "bus.log"
    try:
        done = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", pidfile],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            check=False,
        )
        assert done.returncode == 0 and done.stdout == done.stderr == b""
        _stop_pid_in(pidfile)
        done = subprocess.run(
            [os.path.join(VENV_BIN, "sbus-relay"), "serve", "-a", path, "-p", pidfile,
             "--log-file", str(log)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout == b"", done.stderr
        said = done.stderr.decode().splitlines()
        assert len(said) == 1 and f"logging to {log};" in said[0], said  # nothing else
        pubsub_works(path)
        assert '"event": "listening"' in log.read_text()
    finally:
        _stop_pid_in(pidfile)


def test_a_second_daemon_on_a_live_pid_file_is_refused_in_one_line(short_tmp: Path) -> None:
    directory = str(short_tmp)
    first, second = os.path.join(directory, "one"), os.path.join(directory, "two")
    pidfile = os.path.join(directory, "sbus.pid")
    sbusd = os.path.join(VENV_BIN, "sbusd")
    try:
        started = subprocess.run(
            [sbusd, "-a", first, "-p", pidfile], capture_output=True, timeout=20, check=False
        )
        assert started.returncode == 0, started.stderr
        pid = int(Path(pidfile).read_text())
        again = subprocess.run(
            [sbusd, "-a", second, "-p", pidfile], capture_output=True, timeout=20, check=False
        )
        assert again.returncode == 2
        assert again.stderr.decode().splitlines() == [
            f"sbusd: pid file {pidfile} belongs to a running bus (pid {pid}); give this one"
            " its own with -p PIDFILE (or -p /dev/null for none)"
        ]
        assert not os.path.exists(second)  # nothing was bound
        assert Path(pidfile).read_text().strip() == str(pid)  # the first one's file is intact
        pubsub_works(first)
    finally:
        _stop_pid_in(pidfile)


def test_a_stale_pid_file_is_taken_over(short_tmp: Path) -> None:
    directory = str(short_tmp)
    path = os.path.join(directory, "bus")
    pidfile = os.path.join(directory, "sbus.pid")
    Path(pidfile).write_text("2147483646\n")  # no such process
    try:
        started = subprocess.run(
            [os.path.join(VENV_BIN, "sbusd"), "-a", path, "-p", pidfile],
            capture_output=True,
            timeout=20,
            check=False,
        )
        assert started.returncode == 0, started.stderr
        assert int(Path(pidfile).read_text()) == _owner_of(path)
        pubsub_works(path)
    finally:
        _stop_pid_in(pidfile)


def _owner_of(path: str) -> int:
    """The pid of the daemon started with ``-a path`` (found through /proc).

    Not SO_PEERCRED: that names whoever called listen(), which was before the fork.
    """
    wanted = os.fsencode(path)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in argv and running(int(entry)):
            return int(entry)
    raise AssertionError(f"no process serves {path}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid a child to 65534")
def test_the_readme_multi_user_example_admits_the_listed_user(tmp_path: Path) -> None:
    # docs/protocol.md: `sbusd -a /run/sbus.socket -o -u 1000` run as root lets uid 1000 in.
    bus = start_bus(tmp_path, "-o", "-u", str(NOBODY))
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)
        assert whoami_as_nobody(bus.address).startswith("answer "), bus.stderr_text()[-2000:]
    finally:
        bus.stop(signal.SIGTERM)
    # ... whereas -g opens the socket only to root's group: the listed user
    # cannot even connect (what the old example got wrong).
    bus = start_bus(tmp_path, "-g", "-u", str(NOBODY))
    try:
        os.chmod(os.path.dirname(bus.address), 0o755)
        assert whoami_as_nobody(bus.address).startswith("connect-failed")
    finally:
        bus.stop(signal.SIGTERM)
