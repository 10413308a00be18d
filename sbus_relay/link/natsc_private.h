/* The one place the link reaches into libnats's (nats.c's) private parts.
 *
 * What it owns: every use of libnats beyond its public API (nats/nats.h),
 * each with why; ``natsc_private_check`` says, in one line, whether the
 * installed library is one whose private parts were read and found as
 * written here (``tests/unit/test_natsc_private.py`` calls it through
 * ``_natsc.private_parts()``, so a libnats that is not fails there by name).
 * What it may touch: the natsMsg and natsConnection handed to it.
 *
 * Read in nats.c's sources (src/msg.h, msg.c, gc.h, conn.c, pub.c) for every
 * release from 3.4.0 to 3.13.0: the layout of ``struct __natsMsg`` and of
 * ``natsGCItem``, the "needs lift" flag, natsMsgHeader_encodedLen/encode,
 * natsMsg_create/Destroy/free, natsConn_publish, natsConn_lockAndRetain,
 * natsConn_unlockAndRelease, natsConn_bufferFlush and natsConnection_Status
 * are the same in all of them.  Used only when ``nats_GetVersionNumber()``
 * is in that range and a message built by the library reads back through
 * this layout (``natsc_private_check``); otherwise the engine keeps to the
 * public API (slower: a header hash map per message, a garbage-collector
 * thread's wake-up per message, and nats.c's flusher, which waits 1 ms
 * before each write).
 *
 * 1. A message to publish is a natsMsg on the stack whose ``hdr``/``hdrLen``
 *    hold the header section already encoded (``NATS/1.0\r\nSbus-Origin:
 *    ...\r\n\r\n``) and whose flags say "needs lift": natsConn_publish
 *    writes such a section as it is (the path of a received message sent on
 *    unread), so no header hash map is built and nothing is allocated.
 * 2. A received message's header section is in ``hdr``/``hdrLen`` until
 *    something lifts it into a hash map: the envelope is read from there.
 * 3. A received message is freed at once (``gc.freeCb`` cleared, so that
 *    natsMsg_Destroy frees it in place) instead of being handed to the
 *    library's garbage-collector thread, woken for it.
 * 4. After a batch is published, the connection's buffer is written at once
 *    (natsConn_bufferFlush under the connection's lock, while it is
 *    connected): nats.c's flusher thread waits 1 ms for more before it
 *    writes, which would be most of the latency a message has.
 */
#ifndef SBUS_NATSC_PRIVATE_H
#define SBUS_NATSC_PRIVATE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <nats/nats.h>

/* The releases read (inclusive), as nats_GetVersionNumber() gives them. */
#define NATSC_PRIVATE_FIRST 0x030400u
#define NATSC_PRIVATE_LAST  0x030d00u

/* src/gc.h: natsGCItem */
typedef struct natsc_gc_item {
    struct natsc_gc_item *next;
    void (*freeCb)(void *object);
} natsc_gc_item;

/* src/msg.h: struct __natsMsg (the library allocates the message with its
 * subject, headers and payload after ``next``) */
typedef struct natsc_msg {
    natsc_gc_item   gc;
    const char      *subject;
    const char      *reply;
    char            *hdr;
    void            *headers;
    const char      *data;
    int             dataLen;
    int             hdrLen;
    int             wsz;
    int             flags;
    uint64_t        seq;
    int64_t         time;
    void            *sub;
    struct natsc_msg *next;
} natsc_msg;

/* src/msg.h: natsMsg_setNeedsLift / natsMsg_needsLift */
#define NATSC_NEEDS_LIFT (1 << 0)

/* src/conn.h: exported by the library, not declared in nats.h */
void natsConn_lockAndRetain(natsConnection *nc);
void natsConn_unlockAndRelease(natsConnection *nc);
natsStatus natsConn_bufferFlush(natsConnection *nc);

/* A message to publish, on the caller's stack, with ``block`` (``len``
 * bytes, an encoded header section; NULL: none) as its headers. */
static inline void natsc_msg_init(natsc_msg *m, const char *subject, const char *block, int len,
                                  const char *data, int dataLen) {
    memset(m, 0, sizeof *m);
    m->subject = subject;
    m->data = data;
    m->dataLen = dataLen;
    if (block != NULL) {
        m->hdr = (char *) block;
        m->hdrLen = len;
        m->flags = NATSC_NEEDS_LIFT;
    }
}

/* A received message's header section as the server sent it (NULL: none,
 * or already lifted into a hash map). */
static inline const char *natsc_msg_block(natsMsg *msg, int *len) {
    natsc_msg *m = (natsc_msg *) msg;
    if (m->hdr == NULL || m->hdrLen <= 0 || !(m->flags & NATSC_NEEDS_LIFT))
        return NULL;
    *len = m->hdrLen;
    return m->hdr;
}

/* Free a message now, in this thread (not by the library's collector). */
static inline void natsc_msg_free_now(natsMsg *msg) {
    ((natsc_msg *) msg)->gc.freeCb = NULL;
    natsMsg_Destroy(msg);
}

/* Write what the connection holds, if it is connected (else it stays for the
 * reconnect, as the library keeps it). */
static inline natsStatus natsc_write_now(natsConnection *nc) {
    natsStatus s = NATS_OK;
    natsConn_lockAndRetain(nc);
    /* its mutex is recursive: the status is read under the same lock */
    if (natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED)
        s = natsConn_bufferFlush(nc);
    natsConn_unlockAndRelease(nc);
    return s;
}

/* '' if the installed libnats is a release read and its messages read back
 * through ``natsc_msg``; else why not (``out``, ``size`` bytes). */
static inline int natsc_private_check(char *out, size_t size) {
    /* lifting writes into the section (it ends its strings there): a copy of ours */
    char block[] = "NATS/1.0\r\nSbus-Check: 1 2\r\n\r\n";
    uint32_t v = nats_GetVersionNumber();
    natsMsg *msg = NULL;
    natsc_msg *m;
    const char *value = NULL;
    int ok;
    out[0] = '\0';
    if (v < NATSC_PRIVATE_FIRST || v > NATSC_PRIVATE_LAST) {
        snprintf(out, size, "libnats %s is not a release whose private parts the link knows"
                 " (3.4.0 to 3.13.0)", nats_GetVersion());
        return 0;
    }
    if (natsMsg_Create(&msg, "sbus.check", NULL, "xyz", 3) != NATS_OK) {
        snprintf(out, size, "libnats %s: natsMsg_Create failed", nats_GetVersion());
        return 0;
    }
    m = (natsc_msg *) msg;
    ok = m->subject == natsMsg_GetSubject(msg) && m->data == natsMsg_GetData(msg)
         && m->dataLen == natsMsg_GetDataLength(msg) && m->hdr == NULL && m->hdrLen == 0
         && m->headers == NULL && m->flags == 0 && m->gc.freeCb != NULL;
    if (ok) {
        /* a header section as a received message holds it: the library lifts it */
        m->hdr = block;
        m->hdrLen = (int) sizeof block - 1;
        m->flags = NATSC_NEEDS_LIFT;
        ok = natsMsgHeader_Get(msg, "Sbus-Check", &value) == NATS_OK && value != NULL
             && strcmp(value, "1 2") == 0 && m->headers != NULL
             && !(m->flags & NATSC_NEEDS_LIFT);
        m->hdr = NULL;  /* (not the library's memory: never freed) */
        m->hdrLen = 0;
    }
    /* now, in place: its headers point into ``block`` */
    natsc_msg_free_now(msg);
    if (!ok)
        snprintf(out, size, "libnats %s: its natsMsg is not laid out as the link knows it",
                 nats_GetVersion());
    return ok;
}

#endif
