"""structlog configuration: called once, from the CLI, and nowhere else (STYLE §6).

JSON lines when stderr is not a terminal (journald, files, tests parse them);
coloured key=value lines on a terminal, for people.  Loggers are bound per
connection by the server; here we only choose the renderer and the level.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

#: structlog/stdlib level names to numbers.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and stdlib logging, for libraries) to write to ``stream``.

    ``fmt`` is ``auto`` (JSON unless ``stream`` is a terminal), ``json`` or
    ``console``.  ``level`` is one of ``LEVELS``.
    """
    out = stream if stream is not None else sys.stderr
    number = LEVELS[level.lower()]
    console = fmt == "console" or (fmt == "auto" and _isatty(out))
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=_isatty(out))
        if console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if not console else _keep,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        # Not cached: the CLI configures once, but tests configure several
        # times in one process and must see the newest configuration.
        cache_logger_on_first_use=False,
    )
    # gevent and other libraries log through the stdlib; keep them at the
    # same level and on the same stream.
    logging.basicConfig(level=number, stream=out, format="%(name)s: %(message)s", force=True)


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
