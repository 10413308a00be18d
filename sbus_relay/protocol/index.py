"""The subscription index: which clients want a routing key.  No I/O.

What it owns: which holders want a key: the patterns, the trie and the match
cache.  What it may touch: the first and last callbacks it is given.

Theory of operation (after nats-server's sublist, docs/protocol.md, "Routing keys and wildcards"):

* Patterns without ``*`` (the common case) live in two flat dicts keyed by
  the pattern itself: exact ones, and those ending in '/' (prefixes).  A key
  finds them with one lookup for itself and one per '/' it contains.  This
  keeps a stored pattern to a few dict entries, with no node objects.
* Patterns with ``*`` live in a trie of '/'-separated segments.  Each node has a dict of
  literal children, a ``*`` child, and rare "prefix*" children (``ab*``).
  A pattern ending in '/' is stored as a *tail* subscription on the node of
  its last segment: it matches any key that goes on past that node.
* ``*`` is greedy, as in the reference sbusd: it eats the rest of the
  segment, so a pattern segment ``a*b`` can never match and is kept only so
  that its UNSUB works.
* ``""`` matches every key that is not secret (docs/protocol.md,
  "Credentials and secret keys").  Secret patterns
  (``!/cred/...``, already checked by ``keys.check_pattern``) live in a trie of
  their own, and secret keys are looked up only there, so no wildcard ever
  sees a secret message.
* A leaf holds a tuple of the clients that subscribe there (each once): the
  one truth of who holds what.  Each client also has a list of the patterns
  it subscribed to, so that it can be dropped without a scan; an UNSUB
  leaves its entry behind, and the list is compacted once more than half of
  it is such leftovers.  One list slot per stored pattern, not a set entry
  (a third of the size).  Duplicates are counted apart, only for those.
  The ``on_first``/``on_last`` callbacks fire when the first client comes to a
  pattern and when the last one leaves.  One holder may be *quiet*: on a
  relay that is the upstream link, which holds the patterns the upstream
  wants, so that one ``match`` finds local subscribers and the upstream
  alike; its patterns never fire the callbacks (a relay subscribes upstream
  to what its own clients want, not to what the upstream wants).
* ``match`` answers from a bounded key -> recipients cache, so a publish
  costs a dict lookup and the fan-out, whatever the number of patterns.  A
  subscription change touches only the cached keys its pattern matches (as
  nats-server's sublist does): a new holder is added to their answers, a
  holder that leaves drops them (it may still match them through another
  pattern: the next ``match`` works that out).  An exact pattern finds its
  one key with a lookup; a prefix or a wildcard walks a trie of the cached
  keys' segments (``_Level``) as far as its own segments go, so what a
  change costs grows with the keys it matches, not with the cache.  So
  clients that come and go do not cost the others their cache.  A patched
  answer may list the same clients in another order than a fresh one.  Keys
  that never repeat (an id in every key) would only churn the cache: one
  that filled up without paying for itself stores one miss in
  ``MATCH_CACHE_SAMPLE`` until keys repeat again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from sbus_relay.accel import load_compiled

from .keys import CRED, is_secret
from .limits import MATCH_CACHE_KEY_MAX, MATCH_CACHE_PAYS, MATCH_CACHE_SAMPLE, MATCH_CACHE_SIZE
from .scan import cut, find_byte

#: A subscriber: any hashable object (the bus stores its connections).
C = Any
#: The clients holding one pattern (each once); ``Any`` because trie nodes are
#: shared by every index, whatever its client type.
Holders = tuple[Any, ...]
_EMPTY: Holders = ()
_SLASH = 0x2F  # '/'
_STAR = 0x2A  # '*': as numbers, ``in`` is a plain scan (see ``keys.BANG``)
_STARS = re.compile(rb"\*{2,}")


def canonical(pattern: bytes) -> bytes:
    """The one spelling of a pattern: a run of '*' matches what one '*' does
    (it is greedy), so ``a**/b`` is stored, counted and advertised as ``a*/b``."""
    return _STARS.sub(b"*", pattern) if b"**" in pattern else pattern


class _Node:
    __slots__ = ("children", "exact", "prefixed", "star", "tail")

    def __init__(self) -> None:
        self.children: dict[bytes, _Node] | None = None
        self.star: _Node | None = None
        self.prefixed: dict[bytes, _Node] | None = None
        self.exact: Holders = _EMPTY
        self.tail: Holders = _EMPTY

    def empty(self) -> bool:
        return not (self.children or self.star or self.prefixed or self.exact or self.tail)


def _split(pattern: bytes) -> tuple[list[bytes], bool] | None:
    """Segments of a pattern and whether it ends in '/'; None if it can never match."""
    tail = pattern.endswith(b"/")
    segs = (pattern[:-1] if tail else pattern).split(b"/")
    for i, seg in enumerate(segs):
        star = seg.find(b"*")
        if star >= 0:
            if seg[star + 1 :].strip(b"*"):
                return None  # bytes after a greedy '*' in the same segment
            segs[i] = seg[: star + 1]
    return segs, tail


class SubscriptionIndex:
    """Patterns per client, with counted duplicates, matched through a trie.

    ``on_first(pattern)`` runs when the first client subscribes to a pattern and
    ``on_last(pattern)`` when the last one leaves (a relay turns them into
    upstream SUB/UNSUB, docs/protocol.md, "Relays").
    """

    def __init__(
        self,
        on_first: Callable[[bytes], None] | None = None,
        on_last: Callable[[bytes], None] | None = None,
        cache_size: int = MATCH_CACHE_SIZE,
    ) -> None:
        self._public = _Node()
        self._secret = _Node()
        self._everything: Holders = _EMPTY
        self._exact: dict[bytes, Holders] = {}
        self._prefix: dict[bytes, Holders] = {}
        self._dead: dict[bytes, Holders] = {}
        #: client -> the patterns it subscribed to, including ones it has left
        #: since (counted in _stale) until the list is compacted (``remove``)
        self._owned: dict[C, list[bytes]] = {}
        #: client -> how many entries of its list it no longer holds
        self._stale: dict[C, int] = {}
        #: client -> pattern -> how many times it holds it beyond the first
        self._extra: dict[C, dict[bytes, int]] = {}
        #: client -> (client,), shared by all the patterns it alone holds
        self._solo: dict[C, Holders] = {}
        #: key -> recipients; bounded, its affected keys updated on every
        #: change of a recipient set (``_cache_add``, ``_cache_drop``)
        self.cache: dict[bytes, Holders] = {}
        self.cache_size = cache_size
        #: the cached keys by segments, and how many were filed since it was
        #: last rebuilt (some may have left the cache since)
        self._keys = _Level()
        self._filed = 0
        #: whether every miss is stored, or (keys that do not repeat) one in
        #: MATCH_CACHE_SAMPLE, enough to notice when they start repeating
        self._keeping = True
        self._hits = self._misses = 0
        #: longest prefix pattern and deepest wildcard pattern ever stored: how
        #: far a match looks into a key (high-water marks: bounds, not rules)
        self._prefix_longest = 0
        self._depth = 0
        self._distinct = 0
        self._total = 0
        self.on_first = on_first
        self.on_last = on_last
        #: the holder whose patterns do not fire ``on_first``/``on_last``
        self.quiet: C | None = None

    # --- queries ---------------------------------------------------------

    def match(self, key: bytes) -> tuple[C, ...]:
        """Every client with at least one pattern matching ``key``, each once.

        The cost grows with the key's length and the recipients, never with
        the number of patterns: one dict lookup for the key itself, one per
        '/' within the longest prefix pattern, and a trie walk no deeper than
        the deepest wildcard pattern.
        """
        cache = self.cache
        hit = cache.get(key)
        if hit is not None:
            self._hits += 1
            return hit
        result = self._lookup(key)
        if len(key) <= MATCH_CACHE_KEY_MAX:
            self._misses += 1
            if self._keeping or not self._misses % MATCH_CACHE_SAMPLE:
                self._cache_store(key, result)
        return result

    def lookup(self, key: bytes) -> tuple[C, ...]:
        """What ``match`` answers, worked out afresh: the cache neither read nor filled."""
        return self._lookup(key)

    def _lookup(self, key: bytes) -> Holders:
        secret = key.startswith(CRED)
        parts: list[Holders] = []
        hit = self._exact.get(key)
        if hit:
            parts.append(hit)
        prefixes = self._prefix
        if prefixes:
            longest = self._prefix_longest
            slash = find_byte(key, _SLASH, 0)
            while 0 <= slash < longest:
                head = cut(key, 0, slash + 1)
                hit = prefixes.get(head)
                if hit and (not secret or head.startswith(CRED)):
                    parts.append(hit)
                slash = find_byte(key, _SLASH, slash + 1)
        if secret:
            if self._secret.children is not None:
                _walk(self._secret, key.split(b"/", self._depth), 0, parts)
        else:
            if self._everything:
                parts.append(self._everything)
            if not self._public.empty():
                _walk(self._public, key.split(b"/", self._depth), 0, parts)
        if not parts:
            result: Holders = _EMPTY
        elif len(parts) == 1:
            result = parts[0]  # one source: already each client once
        else:
            merged: dict[Any, None] = {}
            for part in parts:
                merged.update(dict.fromkeys(part))
            result = tuple(merged)
        return result

    def holders(self, pattern: bytes) -> tuple[C, ...]:
        """The clients holding ``pattern`` (each once)."""
        return self._holders(canonical(pattern))

    def _holders(self, pattern: bytes) -> Holders:
        slot = self._slot(pattern, create=False)
        if slot is None:
            return _EMPTY
        node, attr = slot
        if node is not None:
            return node.tail if attr == "tail" else node.exact
        if attr == "everything":
            return self._everything
        return self._flat(attr).get(pattern, _EMPTY)

    def patterns_of(self, client: C) -> dict[bytes, int]:
        """A copy of ``client``'s patterns and their counts."""
        extra = self._extra.get(client, {})
        return {p: 1 + extra.get(p, 0) for p in self._held(client)}

    def distinct_of(self, client: C) -> int:
        """How many distinct patterns ``client`` holds (no copy)."""
        owned = self._owned.get(client)
        return 0 if owned is None else len(owned) - self._stale.get(client, 0)

    def count_of(self, client: C, pattern: bytes) -> int:
        """How many times ``client`` holds ``pattern``."""
        pattern = canonical(pattern)
        if client not in self._holders(pattern):
            return 0
        return 1 + self._extra.get(client, {}).get(pattern, 0)

    def patterns(self) -> Iterator[bytes]:
        """Every distinct pattern held by anyone."""
        seen: set[bytes] = set()
        for client in list(self._owned):
            for p in self._held(client):
                if p not in seen:
                    seen.add(p)
                    yield p

    def _held(self, client: C) -> list[bytes]:
        """``client``'s distinct patterns (its list, without what it has left)."""
        owned = self._owned.get(client)
        if owned is None:
            return []
        if client not in self._stale:
            return owned
        return self._live(client, owned)

    def _live(self, client: C, owned: list[bytes]) -> list[bytes]:
        """The entries of ``owned`` that ``client`` still holds, each once."""
        seen: set[bytes] = set()
        held: list[bytes] = []
        for p in owned:
            if p not in seen and client in self._holders(p):
                seen.add(p)
                held.append(p)
        return held

    @property
    def distinct(self) -> int:
        """Distinct patterns held (by anyone but the quiet holder)."""
        return self._distinct

    def __len__(self) -> int:
        """Stored subscriptions, duplicates counted (the quiet holder's are not)."""
        return self._total

    # --- changes ---------------------------------------------------------

    def add(self, client: C, pattern: bytes) -> None:
        """Subscribe ``client`` to ``pattern`` once more."""
        pattern = canonical(pattern)
        heard = client is not self.quiet
        self._total += heard
        before = self._attach(client, pattern)
        if before is None:  # a duplicate: recipients unchanged, only counted
            extra = self._extra.setdefault(client, {})
            extra[pattern] = extra.get(pattern, 0) + 1
            return
        owned = self._owned.get(client)
        if owned is None:
            owned = self._owned[client] = []
        owned.append(pattern)
        if self.cache:
            self._cache_add(client, pattern)
        if heard and not self._heard(before):
            self._distinct += 1
            if self.on_first is not None:
                self.on_first(pattern)

    def remove(self, client: C, pattern: bytes) -> bool:
        """Remove one subscription; False if ``client`` did not hold ``pattern``."""
        pattern = canonical(pattern)
        owned = self._owned.get(client)
        if owned is None or client not in self._holders(pattern):
            return False
        self._total -= client is not self.quiet
        extra = self._extra.get(client)
        if extra and pattern in extra:
            if extra[pattern] > 1:
                extra[pattern] -= 1
            else:
                del extra[pattern]
                if not extra:
                    del self._extra[client]
            return True
        left = self._detach(client, pattern)
        if self.cache:
            self._cache_drop(client, pattern)
        stale = self._stale.get(client, 0) + 1  # its entry is left behind
        if stale == len(owned):  # it holds nothing more
            del self._owned[client]
            self._stale.pop(client, None)
            self._solo.pop(client, None)
        elif 2 * stale > len(owned):
            # compacted once more than half is left behind: as many removals
            # came before as it keeps, so an UNSUB costs O(1) amortised
            self._owned[client] = self._live(client, owned)
            self._stale.pop(client, None)
        else:
            self._stale[client] = stale
        if client is not self.quiet and not self._heard(left):
            self._distinct -= 1
            if self.on_last is not None:
                self.on_last(pattern)
        return True

    # --- the match cache -------------------------------------------------

    def cached(self, pattern: bytes) -> list[bytes]:
        """The keys in the match cache that ``pattern`` (canonical) matches:
        those a change of its holders touches.  No scan of the cache: an exact
        pattern is one lookup, a prefix or wildcard a walk of the cached keys'
        segments (``_Level``), only ``""`` lists them all."""
        cache = self.cache
        if not cache:
            return []
        if pattern == b"":
            return [key for key in cache if not key.startswith(CRED)]
        star = pattern.find(b"*")
        if star < 0 and not pattern.endswith(b"/"):
            return [pattern] if pattern in cache else []
        if star < 0:
            segs, tail = pattern[:-1].split(b"/"), True
        else:
            split = _split(pattern)
            if split is None:
                return []  # it never matches
            segs, tail = split
        starred = [seg.endswith(b"*") for seg in segs]
        segs = [seg[:-1] if seg.endswith(b"*") else seg for seg in segs]
        out: list[bytes] = []
        _found(self._keys, segs, starred, tail, 0, out)
        # a key filed since it left the cache is not in it; a secret key, for
        # a pattern that is not, is matched by no pattern but a secret one
        secret = pattern.startswith(CRED)
        return [key for key in out if key in cache and key.startswith(CRED) == secret]

    def _cache_add(self, client: C, pattern: bytes) -> None:
        """``client`` has come to ``pattern``: it joins the cached answers of
        the keys ``pattern`` matches (unless it is in them already)."""
        cache = self.cache
        for key in self.cached(pattern):
            hit = cache[key]
            if client not in hit:
                cache[key] = (*hit, client)

    def _cache_drop(self, client: C, pattern: bytes) -> None:
        """``client`` has left ``pattern``: the cached answers that name it for
        keys ``pattern`` matches are dropped (it may hold another pattern that
        matches them; the next ``match`` of such a key works it out)."""
        cache = self.cache
        for key in self.cached(pattern):
            if client in cache[key]:
                del cache[key]

    def _cache_store(self, key: bytes, result: Holders) -> None:
        """Keep ``match``'s answer for ``key``: in the cache, and its key filed
        by segments (the file is rebuilt from the cache when keys that have
        left it make up half of it, so it stays within twice the cache)."""
        cache = self.cache
        if len(cache) >= self.cache_size:
            # never a scan: whole, then it refills with what is hot; and
            # filled in full again only if it paid (keys that repeat)
            self._keeping = self._hits * MATCH_CACHE_PAYS >= len(cache)
            self._hits = 0
            cache.clear()
            self._keys = _Level()
            self._filed = 0
        elif self._filed >= 2 * self.cache_size:
            self._keys = _Level()
            self._filed = 0
            for old in cache:
                _file(self._keys, old)
                self._filed += 1
        cache[key] = result
        _file(self._keys, key)
        self._filed += 1

    # --- trie plumbing ---------------------------------------------------

    def _with(self, holders: Holders, client: C) -> Holders:
        """``holders`` plus ``client``.  A pattern with one holder shares that
        holder's one-element tuple with its other lone patterns, so a stored
        pattern costs its dict entries and no tuple of its own."""
        if holders:
            return (*holders, client)
        solo = self._solo.get(client)
        if solo is None:
            solo = self._solo[client] = (client,)
        return solo

    def _without(self, holders: Holders, client: C) -> Holders:
        left = tuple(c for c in holders if c != client)
        if len(left) == 1:
            return self._with(_EMPTY, left[0])
        return left

    def _heard(self, holders: Holders) -> bool:
        """Whether ``holders`` has anyone but the quiet holder."""
        quiet = self.quiet
        return any(h is not quiet for h in holders)

    def _flat(self, kind: str) -> dict[bytes, Holders]:
        """The dict that holds patterns of ``kind`` outside the trie."""
        return {"exact": self._exact, "prefix": self._prefix, "dead": self._dead}[kind]

    def _slot(self, pattern: bytes, *, create: bool) -> tuple[_Node | None, str] | None:
        """Where a pattern lives: (node, "exact"|"tail") in the trie, or (None, kind)
        with kind "everything", "exact", "prefix" (no '*') or "dead" (never matches)."""
        if pattern == b"":
            return None, "everything"
        if _STAR not in pattern:
            return None, "prefix" if pattern.endswith(b"/") else "exact"
        split = _split(pattern)
        if split is None:
            return None, "dead"
        segs, tail = split
        if create:
            self._depth = max(self._depth, len(segs))
        node = self._secret if is_secret(pattern) else self._public
        for seg in segs:
            nxt: _Node | None
            if seg == b"*":
                nxt = node.star
                if nxt is None and create:
                    nxt = node.star = _Node()
            elif seg.endswith(b"*"):
                table = node.prefixed
                if table is None:
                    if not create:
                        return None
                    table = node.prefixed = {}
                nxt = table.get(seg[:-1])
                if nxt is None and create:
                    nxt = table[seg[:-1]] = _Node()
            else:
                table = node.children
                if table is None:
                    if not create:
                        return None
                    table = node.children = {}
                nxt = table.get(seg)
                if nxt is None and create:
                    nxt = table[seg] = _Node()
            if nxt is None:
                return None
            node = nxt
        return node, "tail" if tail else "exact"

    def _attach(self, client: C, pattern: bytes) -> Holders | None:
        """Store one more holder; the holders before it came, or None if
        ``client`` held ``pattern`` already (then nothing changes)."""
        slot = self._slot(pattern, create=True)
        assert slot is not None
        node, attr = slot
        if attr == "everything":
            before = self._everything
            if client in before:
                return None
            self._everything = self._with(before, client)
        elif node is None:
            flat = self._flat(attr)
            before = flat.get(pattern, _EMPTY)
            if client in before:
                return None
            if attr == "prefix":
                self._prefix_longest = max(self._prefix_longest, len(pattern))
            flat[pattern] = self._with(before, client)
        else:
            before = getattr(node, attr)
            if client in before:
                return None
            setattr(node, attr, self._with(before, client))
        return before

    def _detach(self, client: C, pattern: bytes) -> Holders:
        """Remove one holder; the holders left."""
        if pattern == b"":
            self._everything = self._without(self._everything, client)
            return self._everything
        split = None if _STAR not in pattern else _split(pattern)
        if split is None:
            kind = "dead" if _STAR in pattern else "prefix" if pattern.endswith(b"/") else "exact"
            flat = self._flat(kind)
            left = self._without(flat.get(pattern, _EMPTY), client)
            if left:
                flat[pattern] = left
            else:
                flat.pop(pattern, None)
            return left
        segs, tail = split
        root = self._secret if is_secret(pattern) else self._public
        path: list[tuple[_Node, bytes]] = []
        node = root
        for seg in segs:
            path.append((node, seg))
            if seg == b"*":
                nxt = node.star
            elif seg.endswith(b"*"):
                nxt = node.prefixed.get(seg[:-1]) if node.prefixed else None
            else:
                nxt = node.children.get(seg) if node.children else None
            assert nxt is not None, "index out of step with owned patterns"
            node = nxt
        attr = "tail" if tail else "exact"
        left = self._without(getattr(node, attr), client)
        setattr(node, attr, left)
        # prune empty nodes bottom-up so memory follows the live pattern set
        while path and node.empty():
            parent, seg = path.pop()
            if seg == b"*":
                parent.star = None
            elif seg.endswith(b"*"):
                assert parent.prefixed is not None
                del parent.prefixed[seg[:-1]]
                if not parent.prefixed:
                    parent.prefixed = None
            else:
                assert parent.children is not None
                del parent.children[seg]
                if not parent.children:
                    parent.children = None
            node = parent
        return left


class _Level:
    """The cached keys, by their '/'-separated segments: those that end at this
    depth by their last segment, and the deeper levels by their next one.
    ``SubscriptionIndex`` finds the keys a changed pattern matches here, with
    a walk as long as the pattern, not a test of every cached key."""

    __slots__ = ("down", "ends")

    def __init__(self) -> None:
        self.down: dict[bytes, _Level] | None = None
        self.ends: dict[bytes, bytes] | None = None


def _file(root: _Level, key: bytes) -> None:
    """Put ``key`` under ``root``."""
    level = root
    start = 0
    slash = find_byte(key, _SLASH, 0)
    while slash >= 0:
        seg = cut(key, start, slash)
        if level.down is None:
            level.down = {}
        nxt = level.down.get(seg)
        if nxt is None:
            nxt = level.down[seg] = _Level()
        level = nxt
        start = slash + 1
        slash = find_byte(key, _SLASH, start)
    if level.ends is None:
        level.ends = {}
    level.ends[cut(key, start, len(key))] = key


def _chosen(table: dict[bytes, Any], seg: bytes, starred: bool) -> list[Any]:
    """The values of ``table`` whose segment a pattern segment matches: ``seg``
    itself, or (``starred``: ``seg`` then '*') any that begins with ``seg``."""
    if not starred:
        hit = table.get(seg)
        return [] if hit is None else [hit]
    if not seg:
        return list(table.values())
    return [v for name, v in table.items() if name.startswith(seg)]


def _gather(level: _Level, out: list[bytes]) -> None:
    """Every key under ``level``."""
    if level.ends is not None:
        out.extend(level.ends.values())
    if level.down is not None:
        for child in level.down.values():
            _gather(child, out)


def _found(
    level: _Level, segs: list[bytes], starred: list[bool], tail: bool, i: int, out: list[bytes]
) -> None:
    """The keys under ``level`` that the pattern's segments ``i:`` match: as
    many segments as it has, or (``tail``) more."""
    last = i == len(segs) - 1
    if last and not tail:
        if level.ends is not None:
            out.extend(_chosen(level.ends, segs[i], starred[i]))
        return
    if level.down is None:
        return
    for child in _chosen(level.down, segs[i], starred[i]):
        if last:
            _gather(child, out)  # a tail: whatever goes on past this segment
        else:
            _found(child, segs, starred, tail, i + 1, out)


def _walk(node: _Node, segs: list[bytes], i: int, out: list[Holders]) -> None:
    """Collect the holders of every pattern under ``node`` matching segs[i:].

    ``segs`` may end in the unsplit rest of a key deeper than the trie: no
    node is ever compared with it.
    """
    if i == len(segs):
        if node.exact:
            out.append(node.exact)
        return
    if node.tail and i:
        out.append(node.tail)  # the key goes on past this node with a '/'
    seg = segs[i]
    if node.children is not None:
        child = node.children.get(seg)
        if child is not None:
            _walk(child, segs, i + 1, out)
    if node.star is not None:
        _walk(node.star, segs, i + 1, out)
    if node.prefixed is not None:
        for prefix, child in node.prefixed.items():
            if seg.startswith(prefix):
                _walk(child, segs, i + 1, out)


load_compiled(globals(), "sbus_relay.protocol._c_index")
