"""The Spark that analyze runs on, and the settings it runs with.

What it owns: which Spark a run uses and the settings it gets.  What it may
touch: Spark's session and log level, the processes Spark starts.

Three kinds of Spark, one job:

- a JVM that analyze starts itself: ``local[*]`` by default, or a cluster's
  master (``--master spark://HOST:7077``); its driver settings (heap, collector,
  class archive) are ours;
- a JVM already running in this process (``spark-submit``, a notebook): kept as
  it is;
- a Spark Connect server (``--remote sc://HOST:PORT`` or ``$SPARK_REMOTE``), a
  long-lived Spark that many runs share (``connect`` starts one): no JVM start,
  and a warm one.  Only SQL settings are per run there; the server's own (heap,
  cores) are set where it starts.

Before anything starts, a master or Connect server is probed (a TCP connection,
PROBE_SECONDS): one that does not answer is one line at once, not a minute of
retries.  Ctrl-C is taken over from pyspark (``Interrupts``): it is said at
once, stops the JVM analyze started (there is nothing in it to save), or asks a
Connect server to interrupt this run's jobs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sbus_relay.protocol.errors import SbusError

from . import classarchive, scratch
from .defaults import CONNECT_PORT
from .inputs import InputError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Environment variable naming a Spark Connect server (pyspark's own).
REMOTE_ENV = "SPARK_REMOTE"
#: Port of a ``spark://`` master when its URL gives none (Spark's default).
MASTER_PORT = 7077
#: Seconds to wait for a master or Connect server to accept a TCP connection:
#: a live one answers in milliseconds, even on a loaded machine.
PROBE_SECONDS = 3.0
#: Longest error message of Spark's shown to the user (the rest is in the log).
MAX_ERROR_CHARS = 300
#: Spark's error classes, as its messages begin: ``[FAILED_READ_FILE.NO_HINT]``.
ERROR_CLASS = re.compile(r"\[[A-Z][A-Z_]+(?:\.[A-Z_]+)*\]")
#: Error classes that only gather others (several stages failed at once): the
#: error worth showing is the one they gather, on a later line.
GATHERING_CLASSES = frozenset({"[STAGE_MATERIALIZATION_MULTIPLE_FAILURES]"})
#: How such a class numbers the failures it gathers: ``  1. SparkException: ...``.
ENUMERATED = re.compile(r"^\d+\.\s+")
#: Settings for every run: the console progress bar garbles our output;
#: adaptive query execution sizes the shuffles from the data (local or cluster);
#: and no task waits for a "local" executor (the default 3 s per stage is most of
#: a cluster run's time: every stage reads small cached aggregates).
BASE_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.locality.wait": "0s",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # The job's result comes to the driver as Arrow: zstd (a quarter less time
    # for the warm report's 274,000 rows, mostly the nulls of a union's parts;
    # pyarrow reads Java's LZ4 frames no better than "less than one frame").
    "spark.sql.execution.arrow.compression.codec": "zstd",
}
#: The settings of BASE_CONF that a session of a running Spark (Connect) may set.
SESSION_CONF = {k: v for k, v in BASE_CONF.items() if k.startswith("spark.sql.")}
#: Where the ids of the Connect sessions a user's runs share are kept, under
#: the cache directory (``shared_session``): a file per server.
SESSIONS_DIR = "connect-sessions"
#: What a Connect server says of a session it has closed (idle too long).
CLOSED_SESSION = "INVALID_HANDLE.SESSION_CLOSED"
#: Settings of every session: times in UTC, whatever the machine's zone.
SESSION_TIME_ZONE = {"spark.sql.session.timeZone": "UTC"}
#: Driver JVM settings when we start the JVM (a local run, --master, the Connect
#: server), unless --conf gives them: the throughput collector, a crash report
#: (if any) in the temporary directory rather than the user's, and no web UI (a
#: second saved at start; --conf spark.ui.enabled=true brings it back).  The heap
#: is sized from the input (analyze.heap_mib) or given (--memory), and the class
#: archive (``classarchive``) added when there is one.
DRIVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC -XX:ErrorFile="
    + os.path.join(tempfile.gettempdir(), "sbus-analyze-jvm-crash-%p.log"),
}
#: Executor settings on a cluster (--master other than local), unless --conf
#: gives them: the driver's collector, so both modes run the scan alike (and the
#: class archive when the master listens on loopback: its workers are then on
#: this machine, where the archive is).
CLUSTER_CONF = {
    "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
}
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"


class SparkFailed(SbusError):
    """Spark could not be reached, or failed; the message is one line for the user."""


@dataclass(frozen=True)
class SparkSettings:
    """Where Spark runs and what it may use (one set of options for every command)."""

    #: A master URL (``local[4]``, ``spark://head:7077``); None: ``local[*]`` or
    #: whatever spark-submit was given.
    master: str | None = None
    #: A Spark Connect server, ``sc://HOST:PORT``; None: $SPARK_REMOTE, else none.
    remote: str | None = None
    #: The driver JVM's heap (``4g``); None: sized from the input.
    memory: str | None = None
    #: Extra Spark settings (--conf); they win over ours.
    conf: dict[str, str] = field(default_factory=dict)

    @property
    def cluster(self) -> bool:
        """A master other than local mode."""
        return self.master is not None and not self.master.startswith("local")


def parse_conf(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; InputError on one without ``=``."""
    conf = {}
    for kv in items:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise InputError(f"--conf wants KEY=VALUE, got {kv!r}")
        conf[key] = value
    return conf


def remote_url(settings: SparkSettings) -> str | None:
    """The Connect server to use: --remote, else $SPARK_REMOTE unless --master is
    given (a flag beats the environment); InputError for an empty or malformed one."""
    if settings.remote is not None:
        url, source = settings.remote, "--remote"
    elif settings.master is None and REMOTE_ENV in os.environ:
        url, source = os.environ[REMOTE_ENV], REMOTE_ENV
    else:
        return None
    if not url:
        raise InputError(f"{source} is set but empty: give sc://HOST:PORT, or unset it")
    connect_endpoint(url, source)
    return url


def connect_endpoint(url: str, source: str = "--remote") -> tuple[str, int]:
    """Host and port of ``sc://HOST[:PORT][/;param=value...]``."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "sc" or not parts.hostname or port == -1:
        raise InputError(f"{source} {url!r} is not a Spark Connect URL (sc://HOST:PORT)")
    return parts.hostname, port or CONNECT_PORT


def master_endpoints(master: str) -> list[tuple[str, int]]:
    """Hosts and ports of a ``spark://h1:p1,h2:p2`` master URL (empty for others)."""
    if not master.startswith("spark://"):
        return []
    found = []
    for hostport in master[len("spark://") :].split(","):
        parts = urllib.parse.urlsplit(f"//{hostport}")
        try:
            port = parts.port or MASTER_PORT
        except ValueError:
            raise InputError(f"--master {master!r}: bad port in {hostport!r}") from None
        if not parts.hostname:
            raise InputError(f"--master {master!r}: no host in {hostport!r}")
        found.append((parts.hostname, port))
    return found


def on_loopback(master: str) -> bool:
    """Whether every host of a ``spark://h1:p,h2:p`` master URL is a loopback address."""
    hosts = master_endpoints(master) if master.startswith("spark://") else []
    if not hosts:
        return False
    for host, _port in hosts:
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def probe(host: str, port: int) -> str | None:
    """None when ``host:port`` accepts a TCP connection, else why not (one phrase)."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS):
            return None
    except TimeoutError:
        return f"no answer within {PROBE_SECONDS:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def check_reachable(settings: SparkSettings, remote: str | None) -> None:
    """SparkFailed at once when the Connect server or every master host is unreachable."""
    if remote is not None:
        host, port = connect_endpoint(remote)
        why = probe(host, port)
        if why is not None:
            raise SparkFailed(
                f"cannot reach the Spark Connect server at {remote} ({why}); "
                "is it running? (sbus-relay spark-server starts one)"
            )
        return
    if settings.master is None:
        return
    endpoints = master_endpoints(settings.master)
    reasons = [probe(host, port) for host, port in endpoints]
    if endpoints and all(r is not None for r in reasons):
        raise SparkFailed(f"cannot reach the Spark master at {settings.master} ({reasons[0]})")


def jvm_running() -> bool:
    """Whether this process already has a Spark JVM (spark-submit, a notebook)."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _jvm_process() -> subprocess.Popen[bytes] | None:
    """The JVM process pyspark started for this session (None under spark-submit)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return proc if isinstance(proc, subprocess.Popen) else None


def driver_settings(
    settings: SparkSettings, heap_mib: int, tmp: Path | None = None
) -> dict[str, str]:
    """Every setting of a JVM we start (not the class archive), --conf last.
    With ``tmp``, the JVM's temporary files and Spark's scratch go there
    (``scratch``), and an executor's too when the master is on this machine;
    JVM options given by --conf follow ours (theirs win)."""
    heap = {"spark.driver.memory": settings.memory or f"{heap_mib}m"}
    cluster = CLUSTER_CONF if settings.cluster else {}
    ours = {**BASE_CONF, **DRIVER_CONF, **heap, **cluster, **SESSION_TIME_ZONE}
    if tmp is None:
        return {**ours, **settings.conf}
    ours.update(scratch.spark_conf(tmp))
    keys = [DRIVER_OPTIONS]
    if settings.cluster and settings.master is not None and on_loopback(settings.master):
        keys.append(EXECUTOR_OPTIONS)
    conf = {**ours, **settings.conf}
    for key in keys:
        options = [scratch.java_options(tmp), ours.get(key, ""), settings.conf.get(key, "")]
        conf[key] = " ".join(o for o in options if o)
    return conf


def with_archive(conf: dict[str, str], archive: str, master: str | None) -> dict[str, str]:
    """``conf`` with the class archive option added for the driver (and for the
    executors when the master is on this machine), unless --conf set their options."""
    conf = dict(conf)
    conf[DRIVER_OPTIONS] = f"{conf[DRIVER_OPTIONS]} {archive}"
    if master is not None and EXECUTOR_OPTIONS in conf and on_loopback(master):
        conf[EXECUTOR_OPTIONS] = f"{conf[EXECUTOR_OPTIONS]} {archive}"
    return conf


class Interrupts:
    """SIGINT while analyze runs: said at once (``on_interrupt``), then acted on.

    Deferred while the JVM starts: pyspark launches it ignoring SIGINT (it exits
    when its stdin closes, with this process) but an interrupted launch deletes
    the file the JVM writes its port to, and a JVM that fails there never reads
    its stdin: it would outlive us.  Once it runs, pyspark's own handler is
    replaced too: it calls into the JVM from inside the handler while the main
    thread waits on that same connection.  After the first one, KeyboardInterrupt
    is raised in the main thread."""

    def __init__(self, on_interrupt: Callable[[], None]) -> None:
        self.seen = 0
        self.deferred = True
        self._on_interrupt = on_interrupt
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.seen += 1
        if self.seen == 1:
            self._on_interrupt()
        if not self.deferred:
            raise KeyboardInterrupt

    def arm(self) -> None:
        """From now on SIGINT raises; raise now if one came while deferred."""
        self.deferred = False
        if self.seen:
            raise KeyboardInterrupt

    def end(self, exc: BaseException, session: Session | None) -> NoReturn:
        """A run's way out on ``exc``.  After a Ctrl-C, whatever was raised (the
        KeyboardInterrupt, or a job Spark cut off mid-call) is the interrupt: the
        session is ended at once and KeyboardInterrupt raised.  Before one, the
        session is stopped and ``exc`` goes on."""
        if isinstance(exc, KeyboardInterrupt) or self.seen:
            if session is not None:
                session.interrupt()
            raise KeyboardInterrupt from None
        if session is not None:
            session.stop()
        raise exc


@dataclass
class Session:
    """A SparkSession analyze runs on, and what it needs to end it."""

    spark: SparkSession
    #: The Connect server's URL, or None for a JVM in this process.
    remote: str | None
    #: The JVM process pyspark started (None when it was running already, or remote).
    jvm: subprocess.Popen[bytes] | None
    #: Whether the class archive was used (None: no JVM started here).
    archive: str | None = None
    #: Whether the JVM failed with the archive and was started again without it.
    fell_back: bool = False
    #: Settings given by the user (--conf): they win over the per-run ones.
    given: dict[str, str] = field(default_factory=dict)
    #: The tag of this run's operations on a Connect session that runs share
    #: (``shared_session``): Ctrl-C interrupts those, and the session stays.
    tag: str | None = None
    #: The temporary directory of the JVM started here (``scratch``), removed
    #: once it is stopped.
    scratch: Path | None = None

    def parallelism(self) -> int:
        """The cores the job will run on: ``spark.cores.max`` when given (a cluster's
        executors may not have registered yet when the job is planned, and Spark then
        counts 2); else Spark's default parallelism (``local[N]``'s N, or the cores of
        the executors registered so far).  A Connect server has no SparkContext for
        the client: its ``spark.default.parallelism`` (``sbus-relay spark-server``
        sets it), else its ``local[N]``, else this machine's cores."""
        if self.remote is None:
            given = self.spark.sparkContext.getConf().get("spark.cores.max")
            if given and given.isdigit() and int(given) > 0:
                return int(given)
            return int(self.spark.sparkContext.defaultParallelism)
        conf = self.spark.conf
        for key in ("spark.cores.max", "spark.default.parallelism"):
            value = conf.get(key, None)
            if value and value.isdigit() and int(value) > 0:
                return int(value)
        master = conf.get("spark.master", None) or ""
        inside = master[len("local[") : -1] if master.startswith("local[") else ""
        if inside.isdigit() and int(inside) > 0:
            return int(inside)
        return os.cpu_count() or 1

    def configure(self, conf: dict[str, str]) -> None:
        """Per-run SQL settings, unless --conf gave them."""
        for key, value in conf.items():
            if key not in self.given:
                self.spark.conf.set(key, value)

    def interrupt(self) -> None:
        """After Ctrl-C: end the JVM we started (nothing in it is worth saving), or
        interrupt this session's jobs on the Connect server; then let go."""
        if self.remote is not None:
            try:
                if self.tag is not None:
                    self.spark.interruptTag(self.tag)
                else:
                    self.spark.interruptAll()
            finally:
                self.stop()
            return
        if self.jvm is not None:
            from pyspark import SparkContext

            # pyspark's accumulator server reads the updates of Python workers
            # from the JVM: its connection ends with the JVM, and socketserver
            # would print that end as a traceback.
            server = getattr(SparkContext._active_spark_context, "_accumulatorServer", None)
            if server is not None:
                server.handle_error = _unreported
            self.jvm.kill()
            self.jvm.wait()
            # pyspark must not call into the JVM that is gone (at exit, or later).
            SparkContext._active_spark_context = None
            SparkContext._gateway = None
            SparkContext._jvm = None
            scratch.remove(self.scratch)
            return
        self.spark.sparkContext.cancelAllJobs()
        self.spark.stop()

    def stop(self) -> None:
        """Let go of the session; a shared Connect session stays on the server
        for the next run (only this client's channel closes)."""
        if self.tag is not None:
            self.spark.release_session_on_close = False  # type: ignore[attr-defined]
        try:
            self.spark.stop()
        finally:
            scratch.remove(self.scratch)


def start(
    settings: SparkSettings,
    heap_mib: int,
    jvm_log: str,
    interrupts: Interrupts,
    app_name: str = "sbus-analyze",
    shared: bool = False,
) -> Session:
    """Start (or join) the Spark described by ``settings``, checked reachable first.
    On a Connect server, ``shared``: the session this user's runs share there
    (``shared_session``).

    A JVM started here gets ``driver_settings`` and the class archive when there
    is one; if it does not start with the archive, the archive is dropped and the
    JVM started once more without it."""
    remote = remote_url(settings)
    check_reachable(settings, remote)
    if remote is not None:
        if settings.memory is not None:
            raise InputError(
                "--memory sizes a JVM that analyze starts; a Connect server's memory "
                "is set where the server starts (sbus-relay spark-server --memory)"
            )
        return _remote_session(remote, settings, interrupts, app_name, shared)
    starting = not jvm_running()
    tmp = scratch.make() if starting else None
    try:
        return _local_session(settings, heap_mib, jvm_log, app_name, tmp)
    except BaseException:
        scratch.remove(tmp)
        raise


def _local_session(
    settings: SparkSettings, heap_mib: int, jvm_log: str, app_name: str, tmp: Path | None
) -> Session:
    """A session in this process: on the JVM running here, or on one started
    now (``tmp``: its temporary directory, ``scratch``)."""
    starting = tmp is not None
    conf = driver_settings(settings, heap_mib, tmp)
    own_options = DRIVER_OPTIONS in settings.conf
    archive = classarchive.java_option() if starting and not own_options else None
    fell_back = False
    # local mode: SPARK_REMOTE must not turn the builder into a Connect client.
    os.environ.pop(REMOTE_ENV, None)
    try:
        spark = _off_main_thread(
            build_session,
            settings.master,
            with_archive(conf, archive, settings.master) if archive else conf,
            app_name,
            jvm_log,
        )
    except Exception as exc:
        if archive is None or classarchive.writing() or "JAVA_GATEWAY" not in str(exc):
            raise
        # The JVM did not start with the class archive: drop it, start without.
        classarchive.discard()
        archive, fell_back = None, True
        spark = _off_main_thread(build_session, settings.master, conf, app_name, jvm_log)
    session = Session(
        spark, None, _jvm_process() if starting else None, archive, fell_back, settings.conf
    )
    session.scratch = tmp
    spark.sparkContext.setLogLevel("ERROR")
    return session


def _unreported(request: object, client_address: object) -> None:
    """A socketserver's error handler that reports nothing."""


def _off_main_thread(build: Callable[..., SparkSession], *args: Any) -> SparkSession:
    """``build(*args)`` in a thread of its own while the main thread waits: pyspark
    installs its SIGINT handler only when it creates the SparkContext in the main
    thread, and that handler calls into the JVM from inside the signal handler.
    Ours (``Interrupts``) stays in place, and the wait is interruptible."""
    done: list[SparkSession] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(build(*args))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="spark-start", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


def _remote_session(
    url: str, settings: SparkSettings, interrupts: Interrupts, app_name: str, shared: bool
) -> Session:
    """A session on the Connect server at ``url``, its settings given as it is
    created (one round trip).  ``shared`` (and no --conf): this user's shared
    session on that server (``shared_session``), opened anew when the server
    has closed it; else a session of its own."""
    from pyspark.sql import SparkSession

    conf = {**SESSION_CONF, **SESSION_TIME_ZONE, **settings.conf}
    interrupts.arm()
    shared = shared and not settings.conf
    for renew in (False, True):
        target = f"{url}/;session_id={shared_session(url, renew)}" if shared else url
        builder = SparkSession.builder.remote(target).appName(app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        try:
            spark = builder.create()
        except Exception as exc:
            # A session the server closed (idle too long) says so as its
            # settings are given.  pyspark made it the active session: its
            # channel is closed here, not by the garbage collector.
            failed = SparkSession.getActiveSession()
            if failed is not None:
                failed.release_session_on_close = False  # type: ignore[attr-defined]
                failed.stop()
            if not shared or renew or CLOSED_SESSION not in str(exc):
                raise
            continue
        break
    tag = f"sbus-analyze-{os.getpid()}-{uuid.uuid4().hex[:8]}" if shared else None
    if tag is not None:
        spark.addTag(tag)
    return Session(spark, url, None, given=settings.conf, tag=tag)


def shared_session(url: str, renew: bool = False) -> str:
    """The id of the Connect session this user's runs share on the server at
    ``url``, kept in the cache directory (SESSIONS_DIR); a new one when
    ``renew`` (the server closed the old one) or when there is none yet.

    A session is the server's warm state for its runs: the classes Spark
    generates and compiles for a query are kept per session (the JIT compiles
    them once), and so are its Python workers (``--raw``); a session of its own
    per run pays for both every time.  Runs may share it at once: the settings
    a run gives it (partition sizes) change how the work is split, not the
    result; a run given --conf gets a session of its own."""
    from sbus_relay.ops.cachedir import cache_dir

    path = cache_dir() / SESSIONS_DIR / hashlib.sha256(url.encode()).hexdigest()[:16]
    if not renew:
        try:
            return str(uuid.UUID(path.read_text().strip()))
        except (OSError, ValueError):
            pass
    made = str(uuid.uuid4())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(made + "\n")
    os.replace(tmp, path)
    return made


def build_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "sbus-analyze",
    jvm_log: str | None = None,
) -> SparkSession:
    """A SparkSession in this process; ``master=None`` keeps spark-submit's choice
    (or ``local[*]``).

    With ``jvm_log``, the JVM that this starts writes its stdout and stderr
    (Spark's log, any Java stack trace) into that file instead of the terminal.
    """
    from pyspark.sql import SparkSession

    # Python workers (if any) must run the interpreter that has pyarrow: no
    # PYSPARK_PYTHON needed from the user.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    if master is not None:
        builder = builder.master(master)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    if jvm_log is None or jvm_running():
        return builder.getOrCreate()
    # The JVM's stdout and stderr (Spark's log, any Java stack trace, a crash
    # banner) go to the log: launched here with the builder's settings, then
    # found by getOrCreate, which launches none.
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    settings = SparkConf(loadDefaults=False)
    settings.setAll(list(builder._options.items()))
    with open(jvm_log, "ab") as log:
        gateway = launch_gateway(settings, {"stdout": log, "stderr": subprocess.STDOUT})
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm
    return builder.getOrCreate()


def first_line(exc: BaseException) -> str:
    """The first meaningful line of a Spark/Java failure: py4j's own first line
    ("An error occurred while calling o184.getResult.") says nothing, the Java
    exception's does."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [x.strip().removeprefix(": ").strip() for x in text.splitlines() if x.strip()]
    lines = [x for x in lines if not x.startswith(("at ", "..."))]  # Java stack frames
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        lines = lines[1:]
    # Spark wraps its errors ("Exception thrown in awaitResult:"): the line with
    # an error class ([FAILED_READ_FILE.NO_HINT] ...) is the one that says what,
    # unless that class only gathers the failures of several stages.
    classed = [(x, m.group()) for x in lines if (m := ERROR_CLASS.search(x))]
    telling = [x for x, c in classed if c not in GATHERING_CLASSES] or [x for x, _ in classed]
    chosen = (telling or lines or [type(exc).__name__])[0]
    chosen = ENUMERATED.sub("", chosen.removeprefix("Caused by: "))
    return chosen[:MAX_ERROR_CHARS]


def is_spark_error(exc: BaseException) -> bool:
    """A failure of Spark (the JVM, the gateway, a Connect server), not of our code."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException | Py4JError)
