/* natsload: the NATS load generator of `sbus-relay bench` (the fleet scenario).
 *
 * nats-server's own rate between two C clients (the official client, nats.c),
 * the limit that a bus joined to NATS is measured against, and what the C
 * client itself costs per message:
 *
 *   natsload pub -u URL -s SUBJECT -n N [-z SIZE] [-r RATE]
 *       Connect, print "ready", wait for a line on stdin, publish N messages
 *       of SIZE bytes (>= 8) as fast as possible or at RATE a second, flush,
 *       and print {"first_ns": ..., "cpu_ns": ...}.
 *   natsload sub -u URL -s SUBJECT -n N [-t IDLE_S]
 *       Subscribe, flush (the server has the subscription), print "ready",
 *       take messages until N came or none for IDLE_S seconds, and print
 *       {"count", "last_ns", "p50_us", "p99_us", "cpu_ns"}.
 *
 * A payload's first 8 bytes are its send time on CLOCK_MONOTONIC in
 * nanoseconds, big-endian (as bench/fleetload.py's): one clock for every
 * process of the machine.  Built only where libnats is installed.
 */
#define _GNU_SOURCE
#include <nats/nats.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void put_stamp(char *p, int64_t t)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (char)(t & 0xff);
		t >>= 8;
	}
}

static int64_t get_stamp(const char *p)
{
	int64_t t = 0;
	for (int i = 0; i < 8; i++)
		t = (t << 8) | (unsigned char)p[i];
	return t;
}

static void die(const char *what, natsStatus s)
{
	fprintf(stderr, "natsload: %s: %s\n", what, natsStatus_GetText(s));
	exit(1);
}

static void wait_go(void)
{
	char line[64];
	printf("ready\n");
	fflush(stdout);
	if (fgets(line, sizeof line, stdin) == NULL)
		exit(0);
}

static int pub(natsConnection *nc, const char *subject, long n, int size, long rate)
{
	char *payload = calloc(1, (size_t)size);
	natsStatus s;
	if (payload == NULL)
		return 1;
	memset(payload + 8, 'x', (size_t)size - 8);
	wait_go();
	int64_t first = now_ns(), cpu0 = cpu_ns();
	for (long i = 0; i < n; i++) {
		if (rate > 0) {
			int64_t due = first + (int64_t)(i * (1e9 / (double)rate));
			int64_t ahead = due - now_ns();
			if (ahead > 0) {
				natsConnection_Flush(nc);
				struct timespec ts = {ahead / 1000000000LL, ahead % 1000000000LL};
				nanosleep(&ts, NULL);
			}
		}
		put_stamp(payload, now_ns());
		s = natsConnection_Publish(nc, subject, payload, size);
		if (s != NATS_OK)
			die("publish", s);
	}
	s = natsConnection_FlushTimeout(nc, 30000);
	if (s != NATS_OK)
		die("flush", s);
	printf("{\"first_ns\": %lld, \"cpu_ns\": %lld}\n", (long long)first,
	       (long long)(cpu_ns() - cpu0));
	free(payload);
	return 0;
}

static int cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static int sub(natsConnection *nc, const char *subject, long n, double idle)
{
	natsSubscription *sb = NULL;
	natsMsg *msg = NULL;
	natsStatus s;
	int64_t *lat = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
	long count = 0;
	int64_t last = 0, cpu0;
	if (lat == NULL)
		return 1;
	s = natsConnection_SubscribeSync(&sb, nc, subject);
	if (s == NATS_OK)
		s = natsSubscription_SetPendingLimits(sb, -1, -1);
	if (s == NATS_OK)
		s = natsConnection_FlushTimeout(nc, 10000);
	if (s != NATS_OK)
		die("subscribe", s);
	printf("ready\n");
	fflush(stdout);
	cpu0 = cpu_ns();
	while (count < n) {
		s = natsSubscription_NextMsg(&msg, sb, (int64_t)(idle * 1000));
		if (s == NATS_TIMEOUT)
			break;
		if (s != NATS_OK)
			die("next message", s);
		last = now_ns();
		if (natsMsg_GetDataLength(msg) >= 8)
			lat[count++] = last - get_stamp(natsMsg_GetData(msg));
		natsMsg_Destroy(msg);
	}
	int64_t cpu = cpu_ns() - cpu0;
	qsort(lat, (size_t)count, sizeof(int64_t), cmp64);
	if (count) {
		long i50 = count / 2, i99 = (long)(count * 0.99);
		if (i99 >= count)
			i99 = count - 1;
		printf("{\"count\": %ld, \"last_ns\": %lld, \"p50_us\": %.1f, \"p99_us\": %.1f, "
		       "\"cpu_ns\": %lld}\n",
		       count, (long long)last, lat[i50] / 1000.0, lat[i99] / 1000.0, (long long)cpu);
	} else {
		printf("{\"count\": 0, \"last_ns\": 0, \"p50_us\": null, \"p99_us\": null, "
		       "\"cpu_ns\": %lld}\n",
		       (long long)cpu);
	}
	natsSubscription_Destroy(sb);
	free(lat);
	return 0;
}

int main(int argc, char **argv)
{
	const char *url = NULL, *subject = NULL;
	long n = 0, rate = 0;
	int size = 100, opt;
	double idle = 3.0;
	natsConnection *nc = NULL;
	natsOptions *opts = NULL;
	natsStatus s;

	if (argc < 2) {
		fprintf(stderr, "usage: natsload pub|sub -u URL -s SUBJECT -n N ...\n");
		return 2;
	}
	const char *mode = argv[1];
	optind = 2;
	while ((opt = getopt(argc, argv, "u:s:n:z:r:t:")) != -1) {
		switch (opt) {
		case 'u': url = optarg; break;
		case 's': subject = optarg; break;
		case 'n': n = atol(optarg); break;
		case 'z': size = atoi(optarg); break;
		case 'r': rate = atol(optarg); break;
		case 't': idle = atof(optarg); break;
		default: return 2;
		}
	}
	if (url == NULL || subject == NULL || n <= 0 || size < 8) {
		fprintf(stderr, "natsload: -u URL, -s SUBJECT and -n N (> 0) are needed, SIZE >= 8\n");
		return 2;
	}
	if ((s = natsOptions_Create(&opts)) != NATS_OK || (s = natsOptions_SetURL(opts, url)) != NATS_OK)
		die("options", s);
	/* a fast publisher must not be cut off: a large reconnect buffer is not used,
	 * but the pending limit of a subscriber is set unlimited above */
	if ((s = natsConnection_Connect(&nc, opts)) != NATS_OK)
		die("connect", s);
	int rc;
	if (strcmp(mode, "pub") == 0)
		rc = pub(nc, subject, n, size, rate);
	else if (strcmp(mode, "sub") == 0)
		rc = sub(nc, subject, n, idle);
	else {
		fprintf(stderr, "natsload: unknown mode %s\n", mode);
		rc = 2;
	}
	fflush(stdout);
	natsConnection_Destroy(nc);
	natsOptions_Destroy(opts);
	nats_Close();
	return rc;
}
