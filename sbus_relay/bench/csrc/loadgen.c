/* loadgen: the load generator of `sbus-relay bench`.
 *
 * One small program with four modes, so that the load never comes from Python:
 *
 *   loadgen pub     -a ADDR -n N [-s SIZE] [-r RATE] [-k KEY] [-i ID] [-w]
 *       Send N "MSG KEY\0<payload>" packets, as fast as possible or at RATE
 *       packets/s.  The payload (SIZE bytes, >= 24 to carry them) starts with
 *       "SBLG", the publisher id, a sequence number and the CLOCK_MONOTONIC
 *       send time.  With -w it prints "ready" once connected and waits for a
 *       line on stdin before sending.
 *   loadgen sub     -a ADDR -n N [-p PATTERN] [-t IDLE_S] [-T START_S] [-m MODE]
 *       Optionally send "CMSG blocking/MODE" (e.g. -m hard/block: SPEC §4),
 *       subscribe to PATTERN, wait until the server has taken the subscription
 *       (see barrier()), print "ready", then count MSG packets until it has N,
 *       or none came for IDLE_S seconds (START_S before the first one).
 *   loadgen idle    -a ADDR -c CLIENTS -K PATTERNS [-P PREFIX] [-w]
 *       Open CLIENTS connections (barrier, "connected"), with -w wait for a line
 *       on stdin, subscribe PATTERNS distinct non-matching patterns on each
 *       (barrier, "ready"), then hold them until stdin reaches EOF.
 *   loadgen stalled -a ADDR [-p PATTERN]
 *       Subscribe (barrier, "ready") and never read again, until stdin's EOF.
 *
 * Every mode ends by printing one JSON line on stdout.  Sockets are blocking:
 * a server applying backpressure to a publisher simply slows it down, and the
 * throughput is measured at the subscribers.
 *
 * The barrier: packets of one client are handled in order, so once the server
 * has answered "CMSG !/cred/whoami" (sbus-README "Secret messages") it has
 * taken every packet sent before it.  The reference sbusd answers it and so
 * does forwarder.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common.h" /* address parsing, shared with forwarder.c */

#define MAGIC "SBLG"
#define HEADER_SIZE 24          /* magic(4) + publisher id(4) + seq(8) + time(8) */
#define MAX_PACKET 409600       /* the reference sbusd's limit (SPEC §1) */
#define BATCH 64                /* packets per sendmmsg/recvmmsg call */
#define RECV_SLOT 65536         /* receive buffer per packet of a batch */
#define MAX_PUBLISHERS 256      /* publisher ids tracked for gap detection */
#define WHOAMI "CMSG !/cred/whoami"

struct options {
	const char *address;
	long count;
	long size;
	double rate;
	const char *key;
	const char *pattern;
	const char *prefix;
	const char *mode;
	double idle_s;
	double start_s;
	long clients;
	long patterns;
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

static int barrier(int fd, double timeout_s)
{
	send_text(fd, WHOAMI);
	return await_control(fd, timeout_s);
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

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* ------------------------------------------------------------------ pub */

static int run_pub(const struct options *o)
{
	size_t klen = strlen(o->key), plen = 4 + klen + 1 + (size_t)o->size;
	int stamped = o->size >= HEADER_SIZE, batch = o->rate > 0 ? 1 : BATCH, i;
	unsigned char *bufs;
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	uint64_t start, end, interval = 0, seq = 0;
	int fd;

	if (plen > MAX_PACKET) {
		fprintf(stderr, "loadgen: packet too large\n");
		return 2;
	}
	bufs = malloc(plen * BATCH);
	if (!bufs)
		die("malloc");
	for (i = 0; i < BATCH; i++) {
		unsigned char *p = bufs + plen * (size_t)i;
		memcpy(p, "MSG ", 4);
		memcpy(p + 4, o->key, klen);
		p[4 + klen] = 0;
		memset(p + 5 + klen, 'x', (size_t)o->size);
		if (stamped) {
			memcpy(p + 5 + klen, MAGIC, 4);
			put_u32(p + 9 + klen, o->id);
		}
		iov[i].iov_base = p;
		iov[i].iov_len = plen;
		memset(&msgs[i], 0, sizeof(msgs[i]));
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	fd = connect_bus(o->address);
	if (o->wait_go) {
		say("ready");
		wait_line();
	}
	if (o->rate > 0)
		interval = (uint64_t)(1e9 / o->rate);
	start = now_ns();
	while ((long)seq < o->count) {
		int n = (int)(o->count - (long)seq < batch ? o->count - (long)seq : batch);
		int off = 0;
		uint64_t t;
		if (interval) {
			uint64_t target = start + seq * interval;
			struct timespec ts = { (time_t)(target / 1000000000u),
					       (long)(target % 1000000000u) };
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
		}
		t = now_ns();
		if (stamped)
			for (i = 0; i < n; i++) {
				unsigned char *p = bufs + plen * (size_t)i + 5 + klen;
				put_u64(p + 8, seq + (uint64_t)i);
				put_u64(p + 16, t);
			}
		while (off < n) {
			int sent = sendmmsg(fd, msgs + off, (unsigned)(n - off), MSG_NOSIGNAL);
			if (sent < 0 && errno == EINTR)
				continue;
			if (sent < 0)
				die("sendmmsg");
			off += sent;
		}
		seq += (uint64_t)n;
	}
	end = now_ns();
	printf("{\"mode\":\"pub\",\"sent\":%llu,\"start_ns\":%llu,\"end_ns\":%llu}\n",
	       (unsigned long long)seq, (unsigned long long)start, (unsigned long long)end);
	fflush(stdout);
	close(fd);
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

static int run_sub(const struct options *o)
{
	static unsigned char bufs[BATCH][RECV_SLOT];
	static uint64_t last_seq[MAX_PUBLISHERS];
	static unsigned char seen[MAX_PUBLISHERS];
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	uint64_t *lat = NULL, first = 0, last = 0, bytes = 0;
	size_t nlat = 0, cap = 0;
	long count = 0, control = 0, truncated = 0, gaps = 0, reordered = 0;
	int fd, i, ok, timed_out = 0, closed = 0;
	char sub[4096];

	for (i = 0; i < BATCH; i++) {
		iov[i].iov_base = bufs[i];
		iov[i].iov_len = RECV_SLOT;
		memset(&msgs[i], 0, sizeof(msgs[i]));
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	fd = connect_bus(o->address);
	if (o->mode) {
		snprintf(sub, sizeof(sub), "CMSG blocking/%s", o->mode);
		send_text(fd, sub);
	}
	snprintf(sub, sizeof(sub), "SUB %s", o->pattern);
	send_text(fd, sub);
	ok = barrier(fd, 10.0);
	say("ready");
	set_timeout(fd, o->start_s);
	while (count < o->count) {
		int n = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
		uint64_t t;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			timed_out = 1;
			break;
		}
		if (n < 0)
			die("recvmmsg");
		t = now_ns();
		for (i = 0; i < n; i++) {
			unsigned char *p = bufs[i], *nul;
			size_t len = msgs[i].msg_len;
			if (len == 0) {
				closed = 1;
				break;
			}
			if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)
				truncated++;
			if (len < 4 || memcmp(p, "MSG ", 4) != 0) {
				control++;
				continue;
			}
			if (!count++) {
				first = t;
				set_timeout(fd, o->idle_s);
			}
			last = t;
			bytes += len;
			nul = memchr(p + 4, 0, len - 4);
			if (nul && (size_t)(p + len - nul - 1) >= HEADER_SIZE &&
			    memcmp(nul + 1, MAGIC, 4) == 0) {
				uint32_t id = get_u32(nul + 5);
				uint64_t seq = get_u64(nul + 9), ts = get_u64(nul + 17);
				if (nlat == cap) {
					cap = cap ? cap * 2 : 65536;
					lat = realloc(lat, cap * sizeof(*lat));
					if (!lat)
						die("realloc");
				}
				lat[nlat++] = t > ts ? t - ts : 0;
				if (id < MAX_PUBLISHERS) {
					if (seen[id] && seq <= last_seq[id])
						reordered++;
					else if (seen[id] ? seq > last_seq[id] + 1 : seq > 0)
						gaps++;
					seen[id] = 1;
					last_seq[id] = seq;
				}
			}
		}
		if (closed)
			break;
	}
	if (nlat)
		qsort(lat, nlat, sizeof(*lat), cmp_u64);
	printf("{\"mode\":\"sub\",\"count\":%ld,\"bytes\":%llu,\"first_ns\":%llu,"
	       "\"last_ns\":%llu,\"control\":%ld,\"truncated\":%ld,\"gaps\":%ld,"
	       "\"reordered\":%ld,\"timed_out\":%s,\"closed\":%s,\"barrier\":%s,"
	       "\"lat_n\":%zu,\"lat_p50_us\":%.1f,\"lat_p90_us\":%.1f,"
	       "\"lat_p99_us\":%.1f,\"lat_max_us\":%.1f}\n",
	       count, (unsigned long long)bytes, (unsigned long long)first,
	       (unsigned long long)last, control, truncated, gaps, reordered,
	       timed_out ? "true" : "false", closed ? "true" : "false", ok ? "true" : "false",
	       nlat, percentile_us(lat, nlat, 0.50), percentile_us(lat, nlat, 0.90),
	       percentile_us(lat, nlat, 0.99), nlat ? (double)lat[nlat - 1] / 1000.0 : 0.0);
	fflush(stdout);
	free(lat);
	close(fd);
	return 0;
}

/* ------------------------------------------------------- idle, stalled */

static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Barrier on every connection: send all the whoamis, then collect the answers. */
static long barrier_all(const int *fds, long n)
{
	long i, ok = 0;
	for (i = 0; i < n; i++)
		send_text(fds[i], WHOAMI);
	for (i = 0; i < n; i++)
		ok += await_control(fds[i], 30.0);
	return ok;
}

static int run_idle(const struct options *o)
{
	long c, k, ok1, ok2;
	int *fds;
	char sub[4096];

	raise_fd_limit();
	fds = calloc((size_t)o->clients, sizeof(*fds));
	if (!fds)
		die("calloc");
	for (c = 0; c < o->clients; c++)
		fds[c] = connect_bus(o->address);
	ok1 = barrier_all(fds, o->clients);
	say("connected");
	if (o->wait_go)
		wait_line();
	for (c = 0; c < o->clients; c++)
		for (k = 0; k < o->patterns; k++) {
			snprintf(sub, sizeof(sub), "SUB %s/%ld/%ld/x", o->prefix, c, k);
			send_text(fds[c], sub);
		}
	ok2 = barrier_all(fds, o->clients);
	say("ready");
	printf("{\"mode\":\"idle\",\"clients\":%ld,\"patterns\":%ld,"
	       "\"barrier_connected\":%ld,\"barrier_ready\":%ld}\n",
	       o->clients, o->clients * o->patterns, ok1, ok2);
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
	int fd = connect_bus(o->address), ok;

	snprintf(sub, sizeof(sub), "SUB %s", o->pattern);
	send_text(fd, sub);
	ok = barrier(fd, 10.0);
	say("ready");
	printf("{\"mode\":\"stalled\",\"barrier\":%s}\n", ok ? "true" : "false");
	fflush(stdout);
	wait_eof();
	close(fd);
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: loadgen pub|sub|idle|stalled -a ADDRESS [-n N] [-s SIZE] [-r RATE]\n"
		"       [-k KEY] [-p PATTERN] [-P PREFIX] [-t IDLE_S] [-T START_S]\n"
		"       [-c CLIENTS] [-K PATTERNS] [-i ID] [-m FLOOD_MODE] [-w]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct options o = { NULL, 100000, 64, 0, "bench/data", "bench/data", "idle", NULL,
			     2.0, 30.0, 1, 0, 0, 0 };
	const char *mode;
	int c;

	if (argc < 2)
		usage();
	mode = argv[1];
	optind = 2;
	while ((c = getopt(argc, argv, "a:n:s:r:k:p:P:t:T:c:K:i:m:w")) != -1) {
		switch (c) {
		case 'a': o.address = optarg; break;
		case 'n': o.count = atol(optarg); break;
		case 's': o.size = atol(optarg); break;
		case 'r': o.rate = atof(optarg); break;
		case 'k': o.key = optarg; break;
		case 'p': o.pattern = optarg; break;
		case 'P': o.prefix = optarg; break;
		case 't': o.idle_s = atof(optarg); break;
		case 'T': o.start_s = atof(optarg); break;
		case 'c': o.clients = atol(optarg); break;
		case 'K': o.patterns = atol(optarg); break;
		case 'i': o.id = (unsigned)atol(optarg); break;
		case 'm': o.mode = optarg; break;
		case 'w': o.wait_go = 1; break;
		default: usage();
		}
	}
	if (!o.address || o.count < 0 || o.size < 0 || o.clients < 1 || o.patterns < 0)
		usage();
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
	usage();
	return 2;
}
