"""A small sbus client: ``Client`` (blocking, or cooperative under gevent)."""

from .core import Client, Message

__all__ = ["Client", "Message"]
