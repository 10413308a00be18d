"""structlog configuration: called from the CLI, and nowhere else.

JSON lines when the destination is not a terminal (journald, files, tests
parse them); coloured key=value lines on a terminal, for people.  Loggers are
bound per connection by the server; here we only choose the renderer, the
level and where lines go: a stream (stderr by default), a file, or syslog.

``configure`` may be called again while the bus runs (a reload): loggers
bound before it follow the new level, format and destination, because what
they hold is indirect -- the processor list is changed in place, the level is
checked by its first processor, and each line goes to the writer current when
it is written.  A log file is opened afresh by every call, so a reload also
reopens a file that logrotate moved away.

A log line must never cost the bus anything.  Every line is written with one
``write(2)`` that cannot block -- the descriptor is polled first -- and a line
that cannot be written (a closed pipe, a full disk, a reader that stopped
reading) is dropped and counted (``dropped_lines``, exported as
``sbus_log_lines_dropped_total``), never raised into the code that logged it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
import syslog
from collections.abc import Mapping
from typing import Any, TextIO

import structlog

#: structlog/stdlib level names to numbers.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
#: structlog's method names (aliases too) to levels, for ``_below_level``.
_METHOD_LEVELS = {
    **LEVELS,
    "warn": logging.WARNING,
    "exception": logging.ERROR,
    "msg": logging.INFO,
    "fatal": logging.CRITICAL,
}
#: The log target that means "send lines to the system log" (syslog(3)).
SYSLOG = "syslog"
#: Longest line written, in bytes (newline included); longer lines are cut.
#: At most PIPE_BUF, so that a write to a pipe that polled writable is atomic
#: and never blocks.
MAX_LINE = 4096
#: Marks a line that was cut to MAX_LINE.
_CUT = b"...\n"
#: syslog priorities for our level names.
_SYSLOG_PRIORITY = {
    "debug": syslog.LOG_DEBUG,
    "info": syslog.LOG_INFO,
    "warning": syslog.LOG_WARNING,
    "error": syslog.LOG_ERR,
    "critical": syslog.LOG_CRIT,
}

_dropped = 0


def dropped_lines() -> int:
    """Log lines dropped since start because they could not be written."""
    return _dropped


def _count_drop() -> None:
    global _dropped
    _dropped += 1


class LineWriter:
    """Writes whole lines to a descriptor without ever blocking or raising."""

    def __init__(self, fd: int, *, owned: bool = False) -> None:
        self.fd = fd
        self._owned = owned
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    def write_line(self, text: str, level: str = "info") -> None:
        """Write ``text`` and a newline, or drop it (counted); ``level`` is for syslog."""
        data = text.encode("utf-8", "backslashreplace") + b"\n"
        if len(data) > MAX_LINE:
            data = data[: MAX_LINE - len(_CUT)] + _CUT
        try:
            ready = self._poll.poll(0)
            if not ready or not ready[0][1] & select.POLLOUT:
                _count_drop()  # the reader is not reading: never wait for it
                return
            if os.write(self.fd, data) != len(data):
                _count_drop()
        except (OSError, ValueError):
            _count_drop()  # EPIPE, ENOSPC, EIO, a closed descriptor...

    def close(self) -> None:
        if self._owned:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class _StreamWriter:
    """Lines to a stream that has no descriptor (tests pass a StringIO)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write_line(self, text: str, level: str = "info") -> None:
        try:
            self._stream.write(text + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            _count_drop()

    def close(self) -> None:
        pass


class _SyslogWriter:
    """Lines to syslog(3); the level picks the priority."""

    def __init__(self, ident: str) -> None:
        syslog.openlog(ident, syslog.LOG_PID, syslog.LOG_DAEMON)

    def write_line(self, text: str, level: str = "info") -> None:
        try:
            syslog.syslog(_SYSLOG_PRIORITY.get(level, syslog.LOG_INFO), text)
        except (OSError, ValueError):
            _count_drop()

    def close(self) -> None:
        syslog.closelog()


class _Logger:
    """What structlog's renderer output is handed to: one line per event, to
    the writer current when it is written; the method called is the level
    (syslog picks its priority from it)."""

    def __init__(self, *_names: Any) -> None:
        pass  # structlog passes the logger's name: every logger writes alike

    def debug(self, message: str) -> None:
        _write(message, "debug")

    def info(self, message: str) -> None:
        _write(message, "info")

    def warning(self, message: str) -> None:
        _write(message, "warning")

    def error(self, message: str) -> None:
        _write(message, "error")

    def critical(self, message: str) -> None:
        _write(message, "critical")

    msg = log = info
    warn = warning
    err = exception = error
    failure = fatal = critical


def _write(message: str, level: str) -> None:
    writer = _current
    if writer is None:
        _count_drop()  # logged before configure(): nowhere to go
    else:
        writer.write_line(message, level)


class _Handler(logging.Handler):
    """stdlib logging (gevent and other libraries) through the same writer."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write(self.format(record), record.levelname.lower())
        except Exception:
            _count_drop()


_Writer = LineWriter | _StreamWriter | _SyslogWriter
_current: _Writer | None = None
#: the level below which events are dropped (``_below_level``)
_level = logging.INFO
#: the processor chain every logger holds; changed in place by ``configure``
_PROCESSORS: list[structlog.typing.Processor] = []
#: fields on every line (the server's ``instance``), set by ``configure``
_FIELDS: dict[str, Any] = {}


def _below_level(
    _logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """The first processor: drop an event below the level configured now."""
    if _METHOD_LEVELS.get(method, logging.CRITICAL) < _level:
        raise structlog.DropEvent
    return event


def _add_fields(
    _logger: object, _method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    for key, value in _FIELDS.items():
        event.setdefault(key, value)
    return event


def syslog_ident() -> str:
    """The name this process's lines carry in syslog (``journalctl -t NAME``)."""
    return os.path.basename(sys.argv[0]) or "sbus"


def configure(
    level: str = "info",
    fmt: str = "auto",
    stream: TextIO | None = None,
    *,
    target: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Configure structlog (and stdlib logging, for libraries).

    Lines go to ``target`` when given -- a file path (appended to) or
    ``"syslog"`` -- else to ``stream`` (default stderr).  ``fmt`` is ``auto``
    (JSON unless the destination is a terminal), ``json`` or ``console``;
    ``level`` is one of ``LEVELS``; ``fields`` are added to every line.
    Raises ``OSError`` if the file cannot be opened (nothing changes then).
    """
    global _current, _level
    number = LEVELS[level.lower()]
    writer: _Writer
    if target == SYSLOG:
        # kept across a reload: closing it after opening anew would close both
        writer = _current if isinstance(_current, _SyslogWriter) else _SyslogWriter(syslog_ident())
        tty = False
    elif target is not None:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        writer = LineWriter(fd, owned=True)
        tty = False
    else:
        out = stream if stream is not None else sys.stderr
        with contextlib.suppress(ValueError, OSError):
            out.flush()
        descriptor = _fileno(out)
        writer = LineWriter(descriptor) if descriptor is not None else _StreamWriter(out)
        tty = _isatty(out)
    previous, _current = _current, writer
    if previous is not None and previous is not writer:
        previous.close()
    _level = number
    _FIELDS.clear()
    _FIELDS.update(fields or {})
    console = fmt == "console" or (fmt == "auto" and tty)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=tty)
        if console
        else structlog.processors.JSONRenderer()
    )
    _PROCESSORS[:] = [
        _below_level,
        _add_fields,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info if not console else _keep,
        renderer,
    ]
    structlog.configure(
        processors=_PROCESSORS,
        # Every level passes the wrapper; ``_below_level`` filters, so that a
        # logger bound before a reload follows the level set by it.
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=_Logger,
        # Not cached: the CLI configures once, but tests configure several
        # times in one process and must see the newest configuration.
        cache_logger_on_first_use=False,
    )
    # gevent and other libraries log through the stdlib; keep them at the
    # same level and on the same destination.
    handler = _Handler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.basicConfig(level=number, handlers=[handler], force=True)


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def _keep(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    # ConsoleRenderer formats exceptions itself (and prettier).
    return event


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def configure_relay(level: str, send: Any) -> None:
    """Configure structlog in a helper process whose lines its parent bus writes
    (the NATS link process): each record at ``level`` or above goes to
    ``send(level, event, fields)``, and nothing is written here."""
    global _level
    _level = LEVELS[level.lower()]

    def relay(_logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
        name = "error" if method == "exception" else method
        message = str(event.pop("event", ""))
        event.pop("level", None)
        send(name, message, event)
        raise structlog.DropEvent

    structlog.configure(
        processors=[
            _below_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.format_exc_info,
            relay,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
