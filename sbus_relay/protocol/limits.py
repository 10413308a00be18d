"""Every limit of sbus_relay, each a named constant with its reason.

Defaults that the config may override are marked (config).
"""

from __future__ import annotations

# --- packets ---------------------------------------------------------------
#: Largest packet accepted; the reference sbusd's limit (SPEC §1).  Longer
#: packets are detected with MSG_TRUNC and treated as a misbehaving client.
MAX_PACKET = 409_600

# --- per-client outbound queues (SPEC §4) ------------------------------------
#: (config) Hard limit on bytes queued for one client before its hard mode applies.
HARD_LIMIT_BYTES = 16 * 1024 * 1024
#: (config) Hard limit on messages queued for one client.
HARD_LIMIT_MESSAGES = 65_536

# --- subscriptions ---------------------------------------------------------
#: Distinct patterns one client may hold; bounds memory per client.  A client
#: over it is disconnected (``too_many_patterns``).
MAX_PATTERNS_PER_CLIENT = 65_536
#: Entries in the key -> recipients cache; cleared whole on any subscription
#: change, so it bounds memory, not correctness.
MATCH_CACHE_SIZE = 4096

# --- server ----------------------------------------------------------------
#: (config) Most clients connected at once; further peers are closed at accept.
MAX_CLIENTS = 4096
#: Packets read from one client before yielding to others (fairness); each
#: yield costs a trip through the hub, so not every packet.
READ_BATCH = 128
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
#: Seconds a publisher paused by a block mode sleeps between re-checks, in
#: case a wake-up was missed; bounds the pause's latency, not its length.
BLOCK_RECHECK = 0.05
#: Seconds ``Server.stop`` waits for client greenlets before killing them.
STOP_TIMEOUT = 2.0

# --- relays (SPEC §6) --------------------------------------------------------
#: (config) Upward messages kept while the upstream is away.
UPSTREAM_QUEUE_MESSAGES = 10_000
#: (config) ... and their bytes.
UPSTREAM_QUEUE_BYTES = 16 * 1024 * 1024
#: Upward messages queued while the upstream is connected but slow, beyond
#: which the local publisher is paused (back-pressure, not loss: SPEC §6's
#: bounded drop is for outages only).
UPSTREAM_HIGH_WATER = 1024
#: (config) Reconnect back-off: first delay and cap, seconds.
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0

# --- logging -----------------------------------------------------------------
#: Seconds of quiet after which a slow client's drop episode is logged as over.
DROP_EPISODE_QUIET = 1.0

# --- addresses, daemon and client (SPEC §5) --------------------------------
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
#: Messages a Client keeps while it waits for a reply (whoami); more means the
#: caller is not reading, and the client raises instead of growing without bound.
CLIENT_PENDING_MESSAGES = 10_000
