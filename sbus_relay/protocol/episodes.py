"""Reports of things that repeat, at a bounded rate.  No I/O.

What it owns: when an episode begins, goes on and ends, and what each says.
What it may touch: nothing but its episodes.

One mechanism for everything a connection suffers or does over and over:
messages dropped because it does not read, a pattern refused, an UNSUB of a
pattern it never held...  Each kind of event is an *episode*:

* it **begins** with its first occurrence, reported at once with the
  details (who, which mode, which reason): a subscriber that stops reading
  is named the moment its first message is dropped;
* while it **lasts** it is reported again at most once per
  ``limits.EPISODE_REPORT_INTERVAL``, with the running count;
* it **ends** once ``limits.EPISODE_QUIET`` seconds pass without an
  occurrence (and nothing holds it open), or when its connection closes;
  the end is reported with the total, always for an episode whose end is
  news (a slow consumer that recovered), else only when the earlier lines
  did not already say everything.

Counting costs one integer increment (``Episode.count``): no clock is read
per occurrence.  The owner calls ``tick`` every ``EPISODE_QUIET`` seconds
while ``Episodes`` is non-empty, and logs what ``tick`` returns.
"""

from __future__ import annotations

from sbus_relay.accel import load_compiled

from .limits import EPISODE_QUIET, EPISODE_REPORT_INTERVAL

#: What ``tick`` and ``close`` report: "ongoing" (the running count) or "ended" (the total).
ONGOING = "ongoing"
ENDED = "ended"


class Episode:
    """One open episode: how many times, since when, and what was said of it."""

    __slots__ = ("count", "event", "held", "reported", "said_at", "seen", "since", "tell_end")

    def __init__(self, event: str, now: float, tell_end: bool) -> None:
        self.event = event
        #: occurrences since it began (the owner increments it)
        self.count = 1
        #: ``count`` at the last tick: unchanged over a whole tick means quiet
        #: (0 at first, so an episode lasts at least one whole tick)
        self.seen = 0
        #: ``count`` as last reported
        self.reported = 1
        self.since = now
        self.said_at = now
        #: kept open while True whether or not occurrences come (a client
        #: shedding messages: each one is counted, the episode lasts)
        self.held = False
        #: report the end even when nothing happened since the last line
        self.tell_end = tell_end

    def untold(self) -> bool:
        """Whether its end is worth a line."""
        return self.tell_end or self.count != self.reported


class Episodes:
    """The open episodes of one connection, by event name."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: dict[str, Episode] = {}

    def __bool__(self) -> bool:
        return bool(self.open)

    def begin(self, event: str, now: float, *, tell_end: bool = False) -> Episode | None:
        """Count one occurrence; the new Episode if this one began it (report it), else None."""
        episode = self.open.get(event)
        if episode is not None:
            episode.count += 1
            return None
        episode = self.open[event] = Episode(event, now, tell_end)
        return episode

    def get(self, event: str) -> Episode | None:
        """The open episode of ``event``, if any."""
        return self.open.get(event)

    def tick(self, now: float) -> list[tuple[str, Episode]]:
        """Called every ``EPISODE_QUIET`` seconds: (what, episode) to report.

        An episode with no occurrence since the last tick, not held, ends; one
        still going is reported as ongoing at most once per
        ``EPISODE_REPORT_INTERVAL``.
        """
        reports: list[tuple[str, Episode]] = []
        for event, episode in list(self.open.items()):
            if episode.count == episode.seen and not episode.held:
                del self.open[event]
                if episode.untold():
                    reports.append((ENDED, episode))
                continue
            episode.seen = episode.count
            if now - episode.said_at >= EPISODE_REPORT_INTERVAL and (
                episode.count != episode.reported
            ):
                episode.reported = episode.count
                episode.said_at = now
                reports.append((ONGOING, episode))
        return reports

    def close(self) -> list[tuple[str, Episode]]:
        """The connection is going: every open episode ends; (ENDED, episode) to report."""
        reports = [(ENDED, e) for e in self.open.values() if e.untold()]
        self.open.clear()
        return reports


__all__ = ["ENDED", "EPISODE_QUIET", "ONGOING", "Episode", "Episodes"]

load_compiled(globals(), "sbus_relay.protocol._c_episodes")
