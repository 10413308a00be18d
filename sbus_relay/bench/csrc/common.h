/* common.h: helpers of the benchmark's C programs (static functions: each
 * program includes it once).  Shipped beside them as package data
 * (the bench headers are in pyproject.toml's package-data); build.py hashes
 * it into the build cache key.
 *
 * Address handling: an address is a path, or
 * /dev/unix/abstract/<hex of the sun_path bytes>: all 108 as sbusd prints
 * them, or fewer, the name's length being the number of bytes given. */
#ifndef SBUS_BENCH_COMMON_H
#define SBUS_BENCH_COMMON_H

#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#define SBUS_ABSTRACT_PREFIX "/dev/unix/abstract/"

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Fill *sa from text; return the address length for bind/connect, or -1. */
static socklen_t sbus_parse_address(const char *text, struct sockaddr_un *sa)
{
	size_t plen = strlen(SBUS_ABSTRACT_PREFIX), n, i;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strncmp(text, SBUS_ABSTRACT_PREFIX, plen) == 0) {
		const char *hex = text + plen;
		n = strlen(hex);
		if (n == 0 || n % 2 || n / 2 > sizeof(sa->sun_path))
			return -1;
		for (i = 0; i < n / 2; i++) {
			int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
			if (hi < 0 || lo < 0)
				return -1;
			sa->sun_path[i] = (char)(hi * 16 + lo);
		}
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n / 2);
	}
	n = strlen(text);
	if (n == 0 || n >= sizeof(sa->sun_path))
		return -1;
	memcpy(sa->sun_path, text, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
}

#endif /* SBUS_BENCH_COMMON_H */
