"""Every limit of sbus_relay, each a named constant with its reason.

What it owns: every bound, each with its reason.  What it may touch: nothing.

Defaults that the config may override are marked (config).
"""

from __future__ import annotations

# --- packets ---------------------------------------------------------------
#: Largest packet accepted; the reference sbusd's limit (docs/protocol.md, "Packets").  Longer
#: packets are detected with MSG_TRUNC and treated as a misbehaving client.
MAX_PACKET = 409_600

#: Messages in one packed batch (docs/protocol.md, "Packed batches"): a
#: frame with more is a protocol error, so one packet read never costs more
#: than this many deliveries (the C helper packs with the same bound).
BATCH_MESSAGES = 256

# --- per-client outbound queues (docs/protocol.md, "Flood control") ------------
#: (config) Hard limit on bytes queued for one client before its hard mode applies.
HARD_LIMIT_BYTES = 16 * 1024 * 1024
#: (config) Hard limit on messages queued for one client.
HARD_LIMIT_MESSAGES = 65_536

# --- subscriptions ---------------------------------------------------------
#: (config) Distinct patterns one client may hold; bounds memory per client.  A
#: client over it is disconnected (``too_many_patterns``).
MAX_PATTERNS_PER_CLIENT = 65_536
#: (config) Distinct patterns one relay's connection may hold: it carries the
#: aggregate of all its own clients' patterns (each of them limited there).
MAX_PATTERNS_PER_RELAY = 1_048_576
#: (config) Bytes of distinct patterns one client may hold (patterns are not
#: only counted: a few huge ones must not pin hundreds of MiB).
MAX_PATTERN_BYTES_PER_CLIENT = 4 * 1024 * 1024
#: Longest pattern stored.  Matching a key tries each stored prefix length at
#: most once, so this bounds the work one publish can cost.
MAX_PATTERN_LENGTH = 4096
#: Most '/'-separated segments in a pattern: bounds the depth of the wildcard
#: trie, and so the work of one match.
MAX_PATTERN_SEGMENTS = 128
#: Entries in the key -> recipients cache, cleared whole when full (with the
#: trie of its keys a subscription change walks, at most twice as many): it
#: bounds their memory, not correctness.
MATCH_CACHE_SIZE = 4096
#: A full match cache is filled again with every miss only if it was hit at
#: least once per this many entries since it was last cleared...
MATCH_CACHE_PAYS = 8
#: ... else one miss in this many is stored: enough to notice keys repeating.
MATCH_CACHE_SAMPLE = 16
#: Longest key the match cache keeps: a long key is matched afresh rather than
#: pinning its bytes in the cache.
MATCH_CACHE_KEY_MAX = 256

# --- per-user quotas (all of one uid's connections together) ----------------
#: (config) Connections one user may hold open: half of MAX_CLIENTS, so one
#: user can never take every place and lock the others out.
USER_CONNECTIONS = 2048
#: (config) Distinct patterns, summed over one user's connections.
USER_PATTERNS = 262_144
#: (config) Bytes of those patterns.
USER_PATTERN_BYTES = 32 * 1024 * 1024
#: (config) Bytes queued for all of one user's connections.
USER_QUEUED_BYTES = 256 * 1024 * 1024

# --- server ----------------------------------------------------------------
#: (config) Most clients connected at once; further peers are closed at accept.
MAX_CLIENTS = 4096
#: Packets read from one client per wake-up before the others get a turn
#: (fairness); the loop comes back to it at once if more are waiting.
READ_BATCH = 128
#: Packets the recorder reads in one batch before its writer and its clock get
#: a turn: it serves one socket, so only the batch's bookkeeping is shared.
RECORDER_READ_BATCH = 4096
#: Packets an asyncio client reads per wake-up of its loop before the
#: program's other tasks get a turn.
CLIENT_READ_BATCH = 128
#: Packets a bus's NATS link reads from its bus per wake-up before NATS's own
#: work gets a turn.
LINK_READ_BATCH = 256
#: Packets sent from one client's queue per wake-up, for the same reason.
WRITE_BATCH = 256
#: Connections accepted per wake-up of the listening socket.
ACCEPT_BATCH = 64
#: Accept-loop back-off after an error (EMFILE, ENFILE...): first and cap, seconds.
ACCEPT_BACKOFF_MIN = 0.01
ACCEPT_BACKOFF_MAX = 1.0
#: listen(2) backlog.
LISTEN_BACKLOG = 128
#: SO_SNDBUF asked for every socket we send on: a unix SEQPACKET send fails with
#: EMSGSIZE unless the packet fits the send buffer, and the default (~208 KiB)
#: is smaller than MAX_PACKET.  The kernel doubles the value and caps it at
#: 2 x net.core.wmem_max (425,984 by default), which still fits MAX_PACKET.
SEND_BUFFER = MAX_PACKET + 4096

# --- relays (docs/protocol.md, "Relays") ----------------------------------------
#: (config) Upward messages a relay keeps while its upstream is slow or away,
#: as many as one client's hard limit; beyond it they are dropped and counted
#: (the local bus never waits for its upstream).
UPSTREAM_QUEUE_MESSAGES = 65_536
#: (config) ... and their bytes.
UPSTREAM_QUEUE_BYTES = 16 * 1024 * 1024
#: Seconds a relay waits for its upstream's whoami reply before it warns that
#: the upstream may be part of a relay cycle (it keeps waiting).
WHOAMI_TIMEOUT = 5.0
#: Interest notices or upstream SUB/UNSUBs sent per wake-up: a snapshot of a
#: large pattern set goes out in batches, between other work.
NOTICE_BATCH = 512
#: Seconds between looks at a relay's upstream socket file while it is away,
#: where the kernel cannot tell us at once (libev uses inotify where it can).
UPSTREAM_WATCH = 0.02
#: Seconds after its upstream's socket file changed during which a relay
#: retries every UPSTREAM_WATCH seconds, whatever its back-off: the upstream
#: binds its file a moment before it listens.
UPSTREAM_STARTING = 1.0
#: Seconds a relay holds what it queued during an outage once its upstream is
#: back: the upstream's other relays reconnect (watching its socket file) and
#: subscribe again within milliseconds, and then the held messages reach them.
RESUBSCRIBE_GRACE = 0.1
#: (config) Reconnect back-off: first delay and cap, seconds.
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0

# --- live upgrade (``ops.handover``, docs/deploy.md "Upgrade") -------------------
#: Seconds each step of a hand-over may take (a packet sent, the new process's
#: answer) before the old process gives up on it and serves on.
UPGRADE_TIMEOUT = 10.0
#: Bytes of state in one packet of the hand-over (well within SEND_BUFFER).
UPGRADE_CHUNK = 64 * 1024
#: Descriptors passed in one packet (SCM_MAX_FD is 253).
FDS_PER_PACKET = 250
#: Seconds a signalled bus gives the process it started to take over, and
#: ``sbus-relay upgrade`` waits for a new process to answer on the address.
UPGRADE_WAIT = 30.0
#: Bytes of a failed new process's stderr a bus keeps, to say why in its log.
UPGRADE_STDERR_TAIL = 4096

# --- logging (``protocol.episodes``) -----------------------------------------
#: Seconds without an occurrence after which an episode (a slow consumer's
#: drops, a client's repeated misbehaviour) is over and logged as ended.
EPISODE_QUIET = 1.0
#: Seconds between two "still going" lines of one episode: a subscriber that
#: never reads is named once when its drops begin, then once per interval.
EPISODE_REPORT_INTERVAL = 10.0

# --- addresses, daemon and client (docs/protocol.md, "Addresses and ...") ------
#: Size of sun_path in struct sockaddr_un on Linux; abstract names are printed
#: and bound as the whole 108 bytes, as the reference sbusd does.
SUN_PATH_SIZE = 108
#: Tries at binding a random abstract name before giving up (a clash is
#: astronomically unlikely; the bound only turns a bug into an error).
ABSTRACT_BIND_ATTEMPTS = 8
#: Seconds to wait for a socket file's owner to answer before calling it stale (-r).
STALE_PROBE_TIMEOUT = 1.0
#: Seconds the daemonising parent waits for the daemon to report it is ready.
DAEMON_READY_TIMEOUT = 30.0
#: Packets read, without waiting, to find a bus's disconnect notice after a
#: failed send: it is behind at most the messages already queued to us.
NOTICE_SCAN_PACKETS = 64
#: Messages a Client keeps while it waits for a reply (whoami); more means the
#: caller is not reading, and the client raises instead of growing without bound.
CLIENT_PENDING_MESSAGES = 10_000

#: Relays and users shown by name in the per-relay and per-user series, per
#: dimension; everyone else is summed as "other" (``accounting_top``).
ACCOUNTING_TOP = 10

# --- the client library (``client``, docs/client.md) --------------------------
#: Publishes a client keeps while it is away from its bus, sent in order once
#: it is back; one more is refused with ``BufferFull`` (never dropped unseen).
CLIENT_BUFFER_MESSAGES = 65_536
#: ... and their bytes: as much as one client's hard limit in the server.
CLIENT_BUFFER_BYTES = 16 * 1024 * 1024
#: Reconnect back-off of a client: first delay and cap, seconds.  The cap is
#: far lower than a relay's: a try is one connect() to a local socket (a few
#: microseconds, even for thousands of clients), while every moment between
#: the bus's return and the next try is messages the client does not receive.
CLIENT_RECONNECT_MIN = 0.02
CLIENT_RECONNECT_MAX = 0.1
#: Seconds a client that reconnected holds what it buffered while away: the
#: bus's other clients reconnect within the back-off cap and subscribe again;
#: sent sooner, the buffered messages reach a bus where nobody listens yet
#: (as a relay's ``RESUBSCRIBE_GRACE``).
CLIENT_RESUBSCRIBE_GRACE = 0.15

#: Largest TCP port: what a HOST:PORT (metrics, a NATS server) may name.
MAX_PORT = 65_535
