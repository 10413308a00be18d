/* forwarder: the "limit baseline" of `sbus-relay bench`.
 *
 *   forwarder ADDRESS
 *
 * The least a bus can do: accept SOCK_SEQPACKET clients (epoll, one thread),
 * make a client a subscriber of everything at its first "SUB " packet, and
 * send every "MSG " packet to every subscriber with a blocking send.  No
 * routing, no queues, no flood control: a subscriber that stops reading
 * stalls everything (like the reference sbusd).  "CMSG !/cred/whoami" is
 * answered with "CMSG !/cred/whoami\0" so that loadgen's barrier works; other
 * control messages are ignored.
 *
 * The figures it reaches under loadgen are the ceiling for any bus on this
 * machine; the benchmark reports the real servers as a ratio to them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h" /* address parsing, shared with loadgen.c */

#define MAX_PACKET 409600  /* the reference sbusd's limit (SPEC §1) */
#define MAX_FDS 65536      /* client table size, indexed by fd */
#define READ_BATCH 64      /* packets read from one client before the next */
#define EVENTS 256
#define WHOAMI "CMSG !/cred/whoami"

enum role { FREE, PLAIN, SUBSCRIBER };

static unsigned char role[MAX_FDS];
static int subs[MAX_FDS];
static int nsubs;
static char bound_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static void on_signal(int sig)
{
	(void)sig;
	if (bound_path[0])
		unlink(bound_path);
	_exit(0);
}

static void drop(int ep, int fd)
{
	int i;
	if (role[fd] == SUBSCRIBER)
		for (i = 0; i < nsubs; i++)
			if (subs[i] == fd) {
				subs[i] = subs[--nsubs];
				break;
			}
	role[fd] = FREE;
	epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
}

static void forward(int ep, const unsigned char *buf, size_t len)
{
	int i = 0;
	while (i < nsubs) {
		int fd = subs[i];
		if (send(fd, buf, len, MSG_NOSIGNAL) < 0 && errno != EINTR) {
			drop(ep, fd); /* subs[i] now holds another subscriber */
			continue;
		}
		i++;
	}
}

static void reply_control(int fd, const unsigned char *buf, size_t len)
{
	static unsigned char out[MAX_PACKET + 1];
	const unsigned char *nul = memchr(buf, 0, len);
	size_t keylen = nul ? (size_t)(nul - buf) : len;
	memcpy(out, buf, keylen);
	out[keylen] = 0;
	send(fd, out, keylen + 1, MSG_NOSIGNAL);
}

static void serve_client(int ep, int fd)
{
	static unsigned char buf[MAX_PACKET];
	int k;
	for (k = 0; k < READ_BATCH; k++) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		if (n <= 0) {
			drop(ep, fd);
			return;
		}
		if (role[fd] != SUBSCRIBER && n >= 4 && memcmp(buf, "SUB ", 4) == 0) {
			role[fd] = SUBSCRIBER;
			subs[nsubs++] = fd;
		}
		if (n >= 4 && memcmp(buf, "MSG ", 4) == 0)
			forward(ep, buf, (size_t)n);
		else if ((size_t)n >= strlen(WHOAMI) && memcmp(buf, WHOAMI, strlen(WHOAMI)) == 0)
			reply_control(fd, buf, (size_t)n);
		if (role[fd] == FREE)
			return; /* it was a subscriber and sending to it failed */
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_un sa;
	struct epoll_event ev, events[EVENTS];
	struct rlimit rl;
	socklen_t len;
	int lfd, ep, i, n;

	if (argc != 2) {
		fprintf(stderr, "usage: forwarder ADDRESS\n");
		return 2;
	}
	len = sbus_parse_address(argv[1], &sa);
	if (len == (socklen_t)-1) {
		fprintf(stderr, "forwarder: bad address %s\n", argv[1]);
		return 2;
	}
	prctl(PR_SET_PDEATHSIG, SIGTERM); /* die with the benchmark runner */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGHUP, on_signal);
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max < MAX_FDS ? rl.rlim_max : MAX_FDS;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (lfd < 0) {
		perror("forwarder: socket");
		return 1;
	}
	if (sa.sun_path[0]) {
		unlink(sa.sun_path);
		memcpy(bound_path, sa.sun_path, sizeof(bound_path));
	}
	if (bind(lfd, (struct sockaddr *)&sa, len) < 0 || listen(lfd, 128) < 0) {
		perror("forwarder: bind/listen");
		return 1;
	}
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0) {
		perror("forwarder: epoll_create1");
		return 1;
	}
	ev.events = EPOLLIN;
	ev.data.fd = lfd;
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	for (;;) {
		n = epoll_wait(ep, events, EVENTS, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			perror("forwarder: epoll_wait");
			return 1;
		}
		for (i = 0; i < n; i++) {
			int fd = events[i].data.fd;
			if (fd == lfd) {
				int c;
				/* Client sockets stay blocking: send() waits for a slow reader. */
				while ((c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
					if (c >= MAX_FDS) {
						close(c);
						continue;
					}
					role[c] = PLAIN;
					ev.events = EPOLLIN;
					ev.data.fd = c;
					epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
				}
			} else if (role[fd] != FREE) {
				serve_client(ep, fd);
			}
		}
	}
}
