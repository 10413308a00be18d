/* loadgen: the load generator of `sbus-relay bench`.
 *
 * One small program with five modes, so that the load never comes from Python:
 *
 *   loadgen pub     -a ADDR -n N [-c CONNS] [-s SIZE] [-r RATE] [-k PREFIX]
 *                   [-x KEYMODE] [-N KEYS] [-S SECRET] [-i ID] [-w]
 *       Send N "MSG KEY\0<payload>" packets in all over CONNS connections
 *       (round-robin, connection j publishing as id ID+j), as fast as possible
 *       or at RATE packets/s in all.  The key of a packet of publisher P with
 *       sequence number Q depends on KEYMODE:
 *         fixed     PREFIX/P/0             one key per publisher
 *         cycle     PREFIX/P/(Q mod KEYS)  KEYS keys round-robin
 *         distinct  PREFIX/P/Q             a new key every message (default)
 *         wild      a/P/c/Q, PREFIX/P/Q and SECRET PREFIX/P/Q in turn, for
 *                   subscribers to "a/ * /c/", "PREFIX/" and a secret pattern
 *       The payload (SIZE bytes, >= 24 to carry them) starts with "SBLG", the
 *       publisher id, the sequence number and the CLOCK_MONOTONIC send time.
 *       With -w it prints "ready" once connected, waits for a line on stdin
 *       before sending, and keeps its connections open until stdin's EOF.
 *   loadgen sub     -a ADDR -n N [-c CONNS] [-p PATTERN]... [-e] [-i ID]
 *                   [-t IDLE_S] [-T START_S] [-m MODE]
 *       Open CONNS connections; on each, optionally send "CMSG blocking/MODE"
 *       (e.g. -m hard/block: docs/protocol.md, "Flood control") and subscribe every PATTERN (with -e,
 *       connection j subscribes PATTERN(ID+j)/ instead: one publisher each);
 *       wait until the server has taken the subscriptions (see barrier()),
 *       print "ready", then count MSG packets until every connection has N,
 *       or none came for IDLE_S seconds (START_S before the first one).
 *   loadgen idle    -a ADDR -c CLIENTS -K PATTERNS [-P PREFIX] [-w]
 *       Open CLIENTS connections (barrier, "connected"), with -w wait for a line
 *       on stdin, subscribe PATTERNS distinct non-matching patterns on each
 *       (barrier, "ready"), then hold them until stdin reaches EOF.
 *   loadgen stalled -a ADDR [-p PATTERN]
 *       Subscribe (barrier, "ready") and never read again, until stdin's EOF.
 *   loadgen churn   -a ADDR -c CLIENTS -r RATE [-P PREFIX] [-w]
 *       Open CLIENTS connections (barrier, "ready"), with -w wait for a line on
 *       stdin, then until stdin's EOF send RATE subscription changes/s in all,
 *       round-robin over the connections: each subscribes to a pattern and
 *       unsubscribes from it on its next turn, the patterns going through an
 *       exact key, a prefix and two wildcards in PREFIX's namespace that never
 *       match a measured key (PREFIX/churn/C/N, PREFIX/churn/C/N/,
 *       PREFIX/ * /churn-C-N/ and * / * /churn-C-N, without the spaces).
 *       It never reads: nothing is sent to it.
 *
 * Every mode ends by printing one JSON line on stdout; pub and sub include
 * "cpu_ns", the CPU time they used while the messages flowed (from "go", and
 * from "ready"), so that the bench can say what the load itself costs the
 * cores it shares with the server.  Sockets are blocking
 * for sending: a server applying backpressure to a publisher simply slows it
 * down, and the throughput is measured at the subscribers.
 *
 * The barrier: packets of one client are handled in order, so once the server
 * has answered "CMSG !/cred/whoami" (docs/protocol.md) it has
 * taken every packet sent before it.  The reference sbusd answers it too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common.h" /* address parsing */

#define MAGIC "SBLG"
#define HEADER_SIZE 24          /* magic(4) + publisher id(4) + seq(8) + time(8) */
#define MAX_PACKET 409600       /* the reference sbusd's limit (docs/protocol.md, "Packets") */
#define MAX_KEY 1024            /* bytes of a generated routing key */
#define BATCH 64                /* packets per sendmmsg/recvmmsg call */
#define RECV_SLOT 65536         /* receive buffer per packet of a batch */
#define MAX_PUBLISHERS 256      /* publisher ids tracked for gap detection */
#define MAX_PATTERNS 16         /* -p options of one subscriber */
#define MAX_CONNS 4096          /* connections of one pub or sub process */
#define BARRIER_TIMEOUT 30.0    /* seconds for the server to answer a whoami */
#define WHOAMI "CMSG !/cred/whoami"

enum keymode { KEY_FIXED, KEY_CYCLE, KEY_DISTINCT, KEY_WILD };

struct options {
	const char *address;
	long count;
	long size;
	double rate;
	const char *key;
	enum keymode keymode;
	long keys;
	const char *secret;
	const char *patterns[MAX_PATTERNS];
	int npatterns;
	int each;
	const char *prefix;
	const char *mode;
	double idle_s;
	double start_s;
	long clients;
	long idle_patterns;
	unsigned id;
	int wait_go;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void set_timeout(int fd, double seconds)
{
	struct timeval tv;
	tv.tv_sec = (time_t)seconds;
	tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		die("setsockopt SO_RCVTIMEO");
}

static int connect_bus(const char *address)
{
	struct sockaddr_un sa;
	socklen_t len = sbus_parse_address(address, &sa);
	int fd;

	if (len == (socklen_t)-1) {
		fprintf(stderr, "loadgen: bad address %s\n", address);
		exit(2);
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	if (connect(fd, (struct sockaddr *)&sa, len) < 0)
		die("connect");
	return fd;
}

static void send_text(int fd, const char *text)
{
	if (send(fd, text, strlen(text), MSG_NOSIGNAL) < 0)
		die("send");
}

/* Wait for the answer to a whoami sent earlier; 1 if it came, 0 on timeout. */
static int await_control(int fd, double timeout_s)
{
	char buf[4096];
	set_timeout(fd, timeout_s);
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n < 0)
			die("recv (barrier)");
		if (n == 0) {
			fprintf(stderr, "loadgen: server closed the connection\n");
			exit(2);
		}
		if (n >= 5 && memcmp(buf, "CMSG ", 5) == 0)
			return 1;
	}
}

/* Barrier on every connection: send all the whoamis, then collect the answers. */
static long barrier_all(const int *fds, long n)
{
	long i, ok = 0;
	for (i = 0; i < n; i++)
		send_text(fds[i], WHOAMI);
	for (i = 0; i < n; i++)
		ok += await_control(fds[i], BARRIER_TIMEOUT);
	return ok;
}

static void say(const char *word)
{
	printf("%s\n", word);
	fflush(stdout);
}

static void wait_line(void)
{
	int c;
	while ((c = getchar()) != EOF && c != '\n')
		;
}

static void wait_eof(void)
{
	char buf[256];
	while (read(STDIN_FILENO, buf, sizeof(buf)) > 0)
		;
}

static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static int *connect_all(const char *address, long n)
{
	int *fds;
	long i;
	raise_fd_limit();
	fds = calloc((size_t)n, sizeof(*fds));
	if (!fds)
		die("calloc");
	for (i = 0; i < n; i++)
		fds[i] = connect_bus(address);
	return fds;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* ------------------------------------------------------------------ pub */

/* Write the routing key of publisher id's packet seq; return its length. */
static size_t make_key(char *out, const struct options *o, unsigned id, uint64_t seq)
{
	unsigned long long q = (unsigned long long)seq;
	int n;
	switch (o->keymode) {
	case KEY_FIXED:
		n = snprintf(out, MAX_KEY, "%s/%u/0", o->key, id);
		break;
	case KEY_CYCLE:
		n = snprintf(out, MAX_KEY, "%s/%u/%llu", o->key, id, q % (unsigned long long)o->keys);
		break;
	case KEY_WILD:
		if (q % 3 == 0)
			n = snprintf(out, MAX_KEY, "a/%u/c/%llu", id, q);
		else if (q % 3 == 1)
			n = snprintf(out, MAX_KEY, "%s/%u/%llu", o->key, id, q);
		else
			n = snprintf(out, MAX_KEY, "%s%s/%u/%llu", o->secret, o->key, id, q);
		break;
	default:
		n = snprintf(out, MAX_KEY, "%s/%u/%llu", o->key, id, q);
		break;
	}
	if (n < 0 || n >= MAX_KEY) {
		fprintf(stderr, "loadgen: routing key too long\n");
		exit(2);
	}
	return (size_t)n;
}

/* Fill buf with one MSG packet; return its length. */
static size_t make_packet(unsigned char *buf, const struct options *o, unsigned id,
			  uint64_t seq, uint64_t t)
{
	size_t klen;
	unsigned char *p;
	memcpy(buf, "MSG ", 4);
	klen = make_key((char *)buf + 4, o, id, seq);
	buf[4 + klen] = 0;
	p = buf + 5 + klen;
	memset(p, 'x', (size_t)o->size);
	if (o->size >= HEADER_SIZE) {
		memcpy(p, MAGIC, 4);
		put_u32(p + 4, id);
		put_u64(p + 8, seq);
		put_u64(p + 16, t);
	}
	return 5 + klen + (size_t)o->size;
}

/* CPU time this process has used, user and system, in nanoseconds. */
static uint64_t cpu_ns(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

static int run_pub(const struct options *o)
{
	size_t slot = 5 + MAX_KEY + (size_t)o->size;
	int batch = o->rate > 0 ? 1 : BATCH, i, *fds;
	long conns = o->clients, c = 0;
	unsigned char *bufs;
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	uint64_t start, end, interval = 0, total = 0, *seq, cpu0;

	if (slot > MAX_PACKET) {
		fprintf(stderr, "loadgen: packet too large\n");
		return 2;
	}
	bufs = malloc(slot * BATCH);
	seq = calloc((size_t)conns, sizeof(*seq));
	if (!bufs || !seq)
		die("malloc");
	for (i = 0; i < BATCH; i++) {
		iov[i].iov_base = bufs + slot * (size_t)i;
		memset(&msgs[i], 0, sizeof(msgs[i]));
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	fds = connect_all(o->address, conns);
	if (o->wait_go) {
		say("ready");
		wait_line();
	}
	if (o->rate > 0)
		interval = (uint64_t)(1e9 / o->rate);
	cpu0 = cpu_ns();
	start = now_ns();
	while ((long)total < o->count) {
		int n = (int)(o->count - (long)total < batch ? o->count - (long)total : batch);
		int off = 0;
		unsigned id = o->id + (unsigned)c;
		uint64_t t;
		if (interval) {
			uint64_t target = start + total * interval;
			struct timespec ts = { (time_t)(target / 1000000000u),
					       (long)(target % 1000000000u) };
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
		}
		t = now_ns();
		for (i = 0; i < n; i++)
			iov[i].iov_len = make_packet(iov[i].iov_base, o, id, seq[c] + (uint64_t)i, t);
		while (off < n) {
			int sent = sendmmsg(fds[c], msgs + off, (unsigned)(n - off), MSG_NOSIGNAL);
			if (sent < 0 && errno == EINTR)
				continue;
			if (sent < 0)
				die("sendmmsg");
			off += sent;
		}
		seq[c] += (uint64_t)n;
		total += (uint64_t)n;
		c = (c + 1) % conns;
	}
	end = now_ns();
	printf("{\"mode\":\"pub\",\"sent\":%llu,\"start_ns\":%llu,\"end_ns\":%llu,"
	       "\"cpu_ns\":%llu}\n",
	       (unsigned long long)total, (unsigned long long)start, (unsigned long long)end,
	       (unsigned long long)(cpu_ns() - cpu0));
	fflush(stdout);
	/* Closing at once would lose packets still in the socket: the reference
	 * sbusd drops a client at its hang-up before reading what it left. */
	if (o->wait_go)
		wait_eof();
	for (c = 0; c < conns; c++)
		close(fds[c]);
	free(fds);
	free(seq);
	free(bufs);
	return 0;
}

/* ------------------------------------------------------------------ sub */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static double percentile_us(const uint64_t *v, size_t n, double q)
{
	size_t k;
	if (!n)
		return 0;
	k = (size_t)(q * (double)(n - 1) + 0.5);
	return (double)v[k] / 1000.0;
}

struct sub_state {
	uint64_t *lat, first, last, bytes;
	size_t nlat, cap;
	long count, control, truncated, gaps, reordered;
	uint64_t *last_seq;     /* [connection][publisher] */
	unsigned char *seen;    /* [connection][publisher] */
};

static void note_packet(struct sub_state *s, long conn, const unsigned char *p, size_t len,
			uint64_t t)
{
	const unsigned char *nul;
	if (len < 4 || memcmp(p, "MSG ", 4) != 0) {
		s->control++;
		return;
	}
	if (!s->count++)
		s->first = t;
	s->last = t;
	s->bytes += len;
	nul = memchr(p + 4, 0, len - 4);
	if (nul && (size_t)(p + len - nul - 1) >= HEADER_SIZE && memcmp(nul + 1, MAGIC, 4) == 0) {
		uint32_t id = get_u32(nul + 5);
		uint64_t seq = get_u64(nul + 9), ts = get_u64(nul + 17);
		if (s->nlat == s->cap) {
			s->cap = s->cap ? s->cap * 2 : 65536;
			s->lat = realloc(s->lat, s->cap * sizeof(*s->lat));
			if (!s->lat)
				die("realloc");
		}
		s->lat[s->nlat++] = t > ts ? t - ts : 0;
		if (id < MAX_PUBLISHERS) {
			size_t k = (size_t)conn * MAX_PUBLISHERS + id;
			if (s->seen[k] && seq <= s->last_seq[k])
				s->reordered++;
			else if (s->seen[k] ? seq > s->last_seq[k] + 1 : seq > 0)
				s->gaps++;
			s->seen[k] = 1;
			s->last_seq[k] = seq;
		}
	}
}

static int run_sub(const struct options *o)
{
	static unsigned char bufs[BATCH][RECV_SLOT];
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	struct epoll_event evs[BATCH];
	struct sub_state s;
	long conns = o->clients, want = o->count * o->clients, open_conns, c, ok;
	int *fds, ep, i, k, timed_out = 0;
	char line[4096];
	uint64_t cpu0;

	memset(&s, 0, sizeof(s));
	s.last_seq = calloc((size_t)conns * MAX_PUBLISHERS, sizeof(*s.last_seq));
	s.seen = calloc((size_t)conns * MAX_PUBLISHERS, 1);
	if (!s.last_seq || !s.seen)
		die("calloc");
	for (i = 0; i < BATCH; i++) {
		iov[i].iov_base = bufs[i];
		iov[i].iov_len = RECV_SLOT;
		memset(&msgs[i], 0, sizeof(msgs[i]));
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	fds = connect_all(o->address, conns);
	for (c = 0; c < conns; c++) {
		if (o->mode) {
			snprintf(line, sizeof(line), "CMSG blocking/%s", o->mode);
			send_text(fds[c], line);
		}
		for (k = 0; k < o->npatterns; k++) {
			if (o->each)
				snprintf(line, sizeof(line), "SUB %s%u/", o->patterns[k],
					 o->id + (unsigned)c);
			else
				snprintf(line, sizeof(line), "SUB %s", o->patterns[k]);
			send_text(fds[c], line);
		}
	}
	ok = barrier_all(fds, conns);
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	for (c = 0; c < conns; c++) {
		struct epoll_event ev;
		ev.events = EPOLLIN;
		ev.data.u64 = (uint64_t)c;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[c], &ev) < 0)
			die("epoll_ctl");
	}
	open_conns = conns;
	say("ready");
	cpu0 = cpu_ns();
	while (s.count < want && open_conns > 0) {
		double wait_s = s.count ? o->idle_s : o->start_s;
		int n = epoll_wait(ep, evs, BATCH, (int)(wait_s * 1000));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		if (n == 0) {
			timed_out = 1;
			break;
		}
		for (i = 0; i < n; i++) {
			long conn = (long)evs[i].data.u64;
			int got = recvmmsg(fds[conn], msgs, BATCH, MSG_DONTWAIT, NULL);
			uint64_t t;
			if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
				continue;
			if (got < 0)
				die("recvmmsg");
			t = now_ns();
			for (k = 0; k < got; k++) {
				if (msgs[k].msg_len == 0)
					break;
				if (msgs[k].msg_hdr.msg_flags & MSG_TRUNC)
					s.truncated++;
				note_packet(&s, conn, bufs[k], msgs[k].msg_len, t);
			}
			if (got == 0 || (k < got && msgs[k].msg_len == 0)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fds[conn], NULL);
				open_conns--;
			}
		}
	}
	if (s.nlat)
		qsort(s.lat, s.nlat, sizeof(*s.lat), cmp_u64);
	printf("{\"mode\":\"sub\",\"count\":%ld,\"bytes\":%llu,\"first_ns\":%llu,"
	       "\"last_ns\":%llu,\"control\":%ld,\"truncated\":%ld,\"gaps\":%ld,"
	       "\"reordered\":%ld,\"timed_out\":%s,\"closed\":%ld,\"barrier\":%ld,"
	       "\"lat_n\":%zu,\"lat_p50_us\":%.1f,\"lat_p90_us\":%.1f,"
	       "\"lat_p99_us\":%.1f,\"lat_max_us\":%.1f,\"cpu_ns\":%llu}\n",
	       s.count, (unsigned long long)s.bytes, (unsigned long long)s.first,
	       (unsigned long long)s.last, s.control, s.truncated, s.gaps, s.reordered,
	       timed_out ? "true" : "false", conns - open_conns, ok, s.nlat,
	       percentile_us(s.lat, s.nlat, 0.50), percentile_us(s.lat, s.nlat, 0.90),
	       percentile_us(s.lat, s.nlat, 0.99),
	       s.nlat ? (double)s.lat[s.nlat - 1] / 1000.0 : 0.0,
	       (unsigned long long)(cpu_ns() - cpu0));
	fflush(stdout);
	for (c = 0; c < conns; c++)
		close(fds[c]);
	close(ep);
	free(fds);
	free(s.lat);
	free(s.last_seq);
	free(s.seen);
	return 0;
}

/* ------------------------------------------------------- idle, stalled */

static int run_idle(const struct options *o)
{
	long c, k, ok1, ok2;
	int *fds;
	char sub[4096];

	fds = connect_all(o->address, o->clients);
	ok1 = barrier_all(fds, o->clients);
	say("connected");
	if (o->wait_go)
		wait_line();
	for (c = 0; c < o->clients; c++)
		for (k = 0; k < o->idle_patterns; k++) {
			snprintf(sub, sizeof(sub), "SUB %s/%ld/%ld/x", o->prefix, c, k);
			send_text(fds[c], sub);
		}
	ok2 = barrier_all(fds, o->clients);
	say("ready");
	printf("{\"mode\":\"idle\",\"clients\":%ld,\"patterns\":%ld,"
	       "\"barrier_connected\":%ld,\"barrier_ready\":%ld}\n",
	       o->clients, o->clients * o->idle_patterns, ok1, ok2);
	fflush(stdout);
	wait_eof();
	for (c = 0; c < o->clients; c++)
		close(fds[c]);
	free(fds);
	return 0;
}

static int run_stalled(const struct options *o)
{
	char sub[4096];
	int fd = connect_bus(o->address);
	long ok;

	snprintf(sub, sizeof(sub), "SUB %s", o->npatterns ? o->patterns[0] : "bench/");
	send_text(fd, sub);
	ok = barrier_all(&fd, 1);
	say("ready");
	printf("{\"mode\":\"stalled\",\"barrier\":%s}\n", ok ? "true" : "false");
	fflush(stdout);
	wait_eof();
	close(fd);
	return 0;
}

/* The pattern connection c subscribes to on its n-th change (see the top). */
static void churn_pattern(char *out, size_t size, const char *prefix, long c, long n)
{
	switch (n % 4) {
	case 0: snprintf(out, size, "%s/churn/%ld/%ld", prefix, c, n); break;
	case 1: snprintf(out, size, "%s/churn/%ld/%ld/", prefix, c, n); break;
	case 2: snprintf(out, size, "%s/*/churn-%ld-%ld/", prefix, c, n); break;
	default: snprintf(out, size, "*/*/churn-%ld-%ld", c, n); break;
	}
}

static int run_churn(const struct options *o)
{
	char pattern[512], packet[600];
	long *turns, c = 0, ok;
	uint64_t start, interval, changes = 0, cpu0;
	int *fds;
	struct pollfd in = { STDIN_FILENO, POLLIN, 0 };

	if (o->rate <= 0) {
		fprintf(stderr, "loadgen: churn needs -r RATE\n");
		return 2;
	}
	turns = calloc((size_t)o->clients, sizeof(*turns));
	if (!turns)
		die("calloc");
	fds = connect_all(o->address, o->clients);
	ok = barrier_all(fds, o->clients);
	say("ready");
	if (o->wait_go)
		wait_line();
	interval = (uint64_t)(1e9 / o->rate);
	cpu0 = cpu_ns();
	start = now_ns();
	for (;;) {
		uint64_t target = start + changes * interval, now = now_ns();
		/* wait for the next change's time, watching stdin for its EOF */
		int wait_ms = target > now ? (int)((target - now + 999999u) / 1000000u) : 0;
		if (poll(&in, 1, wait_ms) > 0) {
			char buf[256];
			if (read(STDIN_FILENO, buf, sizeof(buf)) <= 0)
				break;
			continue;
		}
		if (now_ns() < target)
			continue;
		/* even turns subscribe, odd turns unsubscribe what the turn before did */
		churn_pattern(pattern, sizeof(pattern), o->prefix, c, turns[c] / 2);
		snprintf(packet, sizeof(packet), "%s %s", turns[c] % 2 ? "UNSUB" : "SUB", pattern);
		send_text(fds[c], packet);
		turns[c]++;
		changes++;
		c = (c + 1) % o->clients;
	}
	printf("{\"mode\":\"churn\",\"clients\":%ld,\"changes\":%llu,\"seconds\":%.3f,"
	       "\"barrier\":%ld,\"cpu_ns\":%llu}\n",
	       o->clients, (unsigned long long)changes, (double)(now_ns() - start) / 1e9, ok,
	       (unsigned long long)(cpu_ns() - cpu0));
	fflush(stdout);
	for (c = 0; c < o->clients; c++)
		close(fds[c]);
	free(fds);
	free(turns);
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: loadgen pub|sub|idle|stalled|churn -a ADDRESS [-n N] [-c CONNS] [-s SIZE]\n"
		"       [-r RATE] [-k PREFIX] [-x fixed|cycle|distinct|wild] [-N KEYS]\n"
		"       [-S SECRET] [-p PATTERN]... [-e] [-P PREFIX] [-t IDLE_S] [-T START_S]\n"
		"       [-K PATTERNS] [-i ID] [-m FLOOD_MODE] [-w]\n");
	exit(2);
}

static enum keymode parse_keymode(const char *text)
{
	if (!strcmp(text, "fixed"))
		return KEY_FIXED;
	if (!strcmp(text, "cycle"))
		return KEY_CYCLE;
	if (!strcmp(text, "distinct"))
		return KEY_DISTINCT;
	if (!strcmp(text, "wild"))
		return KEY_WILD;
	usage();
	return KEY_DISTINCT;
}

int main(int argc, char **argv)
{
	struct options o;
	const char *mode;
	int c;

	memset(&o, 0, sizeof(o));
	o.count = 100000;
	o.size = 64;
	o.key = "bench";
	o.keymode = KEY_DISTINCT;
	o.keys = 1000;
	o.secret = "";
	o.prefix = "idle";
	o.idle_s = 2.0;
	o.start_s = 30.0;
	o.clients = 1;
	if (argc < 2)
		usage();
	mode = argv[1];
	optind = 2;
	while ((c = getopt(argc, argv, "a:n:s:r:k:x:N:S:p:eP:t:T:c:K:i:m:w")) != -1) {
		switch (c) {
		case 'a': o.address = optarg; break;
		case 'n': o.count = atol(optarg); break;
		case 's': o.size = atol(optarg); break;
		case 'r': o.rate = atof(optarg); break;
		case 'k': o.key = optarg; break;
		case 'x': o.keymode = parse_keymode(optarg); break;
		case 'N': o.keys = atol(optarg); break;
		case 'S': o.secret = optarg; break;
		case 'p':
			if (o.npatterns == MAX_PATTERNS)
				usage();
			o.patterns[o.npatterns++] = optarg;
			break;
		case 'e': o.each = 1; break;
		case 'P': o.prefix = optarg; break;
		case 't': o.idle_s = atof(optarg); break;
		case 'T': o.start_s = atof(optarg); break;
		case 'c': o.clients = atol(optarg); break;
		case 'K': o.idle_patterns = atol(optarg); break;
		case 'i': o.id = (unsigned)atol(optarg); break;
		case 'm': o.mode = optarg; break;
		case 'w': o.wait_go = 1; break;
		default: usage();
		}
	}
	if (!o.address || o.count < 0 || o.size < 0 || o.clients < 1 || o.clients > MAX_CONNS ||
	    o.idle_patterns < 0 || o.keys < 1)
		usage();
	if (!strcmp(mode, "sub") && !o.npatterns)
		o.patterns[o.npatterns++] = "bench/";
	/* Die with the benchmark runner, whatever kills it. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGPIPE, SIG_IGN);
	if (strcmp(mode, "pub") == 0)
		return run_pub(&o);
	if (strcmp(mode, "sub") == 0)
		return run_sub(&o);
	if (strcmp(mode, "idle") == 0)
		return run_idle(&o);
	if (strcmp(mode, "stalled") == 0)
		return run_stalled(&o);
	if (strcmp(mode, "churn") == 0)
		return run_churn(&o);
	usage();
	return 2;
}
