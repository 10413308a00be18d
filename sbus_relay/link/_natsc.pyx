# cython: language_level=3
"""The official NATS C client (nats.c, libnats) for the link's nats.c engine.

What it owns: one natsConnection and the queue between nats.c's threads and
the link's thread.  What it may touch: nothing of Python from nats.c's
threads: they only append to the queue (a mutex, an eventfd), and the link's
thread drains it (``Client.drain``), so the GIL is never taken there.

nats.c reads and parses in a thread of its own and hands each message to
one delivery thread for every subscription (global delivery, a pool of
one: messages reach the link in the order the server sent them, across
subscriptions); that thread's callback queues it.  Publishing copies into
nats.c's buffer, written once per batch.  Built only where libnats was found
at install time (setup.py); the link runs nats-py elsewhere
(``link/engine.py``).

The envelope (``protocol.natsenvelope``) is the one header the link reads
or writes.  Where the installed libnats is a release whose private parts the
link knows (``natsc_private.h``, the one place it reaches into them:
``private_parts()`` says), a message is published with its header section
encoded once, read on receipt straight from the section the server sent,
freed at once, and each batch is written as soon as it is handed over;
elsewhere the public API does the same, slower.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport free
from libc.string cimport memcmp, memcpy, strlen
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeASCII, PyUnicode_GET_LENGTH

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)

cdef extern from "nats/nats.h" nogil:
    ctypedef struct natsConnection:
        pass
    ctypedef struct natsOptions:
        pass
    ctypedef struct natsSubscription:
        pass
    ctypedef struct natsMsg:
        pass
    ctypedef int natsStatus
    ctypedef void (*natsMsgHandler)(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
    ctypedef void (*natsConnectionHandler)(natsConnection *nc, void *closure)
    ctypedef void (*natsErrHandler)(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)

    natsStatus NATS_OK
    natsStatus NATS_ERR
    natsStatus NATS_NOT_YET_CONNECTED
    natsStatus NATS_SLOW_CONSUMER

    natsStatus nats_Open(int64_t lockSpinCount)
    natsStatus nats_SetMessageDeliveryPoolSize(int max)
    const char *natsStatus_GetText(natsStatus s)
    natsStatus natsOptions_Create(natsOptions **opts)
    void natsOptions_Destroy(natsOptions *opts)
    natsStatus natsOptions_SetServers(natsOptions *opts, const char **servers, int count)
    natsStatus natsOptions_SetName(natsOptions *opts, const char *name)
    natsStatus natsOptions_SetNoEcho(natsOptions *opts, bint noEcho)
    natsStatus natsOptions_SetNoRandomize(natsOptions *opts, bint noRandomize)
    natsStatus natsOptions_SetAllowReconnect(natsOptions *opts, bint allow)
    natsStatus natsOptions_SetMaxReconnect(natsOptions *opts, int maxReconnect)
    natsStatus natsOptions_SetReconnectWait(natsOptions *opts, int64_t wait)
    natsStatus natsOptions_SetTimeout(natsOptions *opts, int64_t timeout)
    natsStatus natsOptions_SetPingInterval(natsOptions *opts, int64_t interval)
    natsStatus natsOptions_SetMaxPingsOut(natsOptions *opts, int maxPingsOut)
    natsStatus natsOptions_SetReconnectBufSize(natsOptions *opts, int size)
    natsStatus natsOptions_SetUserInfo(natsOptions *opts, const char *user, const char *password)
    natsStatus natsOptions_SetToken(natsOptions *opts, const char *token)
    natsStatus natsOptions_SetUserCredentialsFromFiles(natsOptions *opts, const char *userOrChainedFile, const char *seedFile)
    natsStatus natsOptions_SetSecure(natsOptions *opts, bint secure)
    natsStatus natsOptions_LoadCATrustedCertificates(natsOptions *opts, const char *fileName)
    natsStatus natsOptions_UseGlobalMessageDelivery(natsOptions *opts, bint glob)
    natsStatus natsOptions_SetRetryOnFailedConnect(natsOptions *opts, bint retry, natsConnectionHandler cb, void *closure)
    natsStatus natsOptions_SetDisconnectedCB(natsOptions *opts, natsConnectionHandler cb, void *closure)
    natsStatus natsOptions_SetReconnectedCB(natsOptions *opts, natsConnectionHandler cb, void *closure)
    natsStatus natsOptions_SetClosedCB(natsOptions *opts, natsConnectionHandler cb, void *closure)
    natsStatus natsOptions_SetErrorHandler(natsOptions *opts, natsErrHandler cb, void *closure)
    natsStatus natsConnection_Connect(natsConnection **nc, natsOptions *opts)
    natsStatus natsConnection_GetConnectedUrl(natsConnection *nc, char *buffer, size_t size)
    natsStatus natsConnection_Publish(natsConnection *nc, const char *subj, const void *data, int dataLen)
    natsStatus natsConnection_PublishMsg(natsConnection *nc, natsMsg *msg)
    natsStatus natsConnection_FlushTimeout(natsConnection *nc, int64_t timeout)
    natsStatus natsConnection_Subscribe(natsSubscription **sub, natsConnection *nc, const char *subject, natsMsgHandler cb, void *closure)
    void natsConnection_Close(natsConnection *nc)
    void natsConnection_Destroy(natsConnection *nc)
    natsStatus natsSubscription_SetPendingLimits(natsSubscription *sub, int msgLimit, int bytesLimit)
    natsStatus natsSubscription_Unsubscribe(natsSubscription *sub)
    void natsSubscription_Destroy(natsSubscription *sub)
    natsStatus natsMsg_Create(natsMsg **msg, const char *subj, const char *reply, const char *data, int dataLen)
    const char *natsMsg_GetSubject(const natsMsg *msg)
    const char *natsMsg_GetData(const natsMsg *msg)
    int natsMsg_GetDataLength(const natsMsg *msg)
    natsStatus natsMsgHeader_Set(natsMsg *msg, const char *key, const char *value)
    natsStatus natsMsgHeader_Get(natsMsg *msg, const char *key, const char **value)
    void natsMsg_Destroy(natsMsg *msg)

cdef extern from "natsc_private.h" nogil:
    ctypedef struct natsc_msg:
        const char *subject
    void natsc_msg_init(natsc_msg *m, const char *subject, const char *block, int len,
                        const char *data, int dataLen)
    const char *natsc_msg_block(natsMsg *msg, int *len)
    void natsc_msg_free_now(natsMsg *msg)
    natsStatus natsc_write_now(natsConnection *nc)
    int natsc_private_check(char *out, size_t size)

cdef extern from *:
    """
    #include <errno.h>
    #include <pthread.h>
    #include <stdint.h>
    #include <stdlib.h>
    #include <sys/eventfd.h>
    #include <unistd.h>

    /* What nats.c's threads hand to the link's thread: one queue per process
       (a link process has one connection), double-buffered. */
    enum { EV_MSG = 0, EV_CONNECTED, EV_RECONNECTED, EV_DISCONNECTED, EV_CLOSED, EV_SLOW, EV_ERROR };
    typedef struct { int kind; int64_t sid; natsMsg *msg; natsStatus status; } sq_entry;
    typedef struct {
        pthread_mutex_t lock;
        int fd;                  /* eventfd: written when the queue stops being empty */
        sq_entry *items; size_t count, cap;
        size_t msgs;             /* messages in items */
        size_t max_msgs;         /* beyond it a message is dropped, counted */
        int64_t dropped;         /* dropped so, since the last drain */
    } sq_queue;
    static sq_queue sq = {PTHREAD_MUTEX_INITIALIZER, -1, NULL, 0, 0, 0, 0, 0};

    static int sq_open(size_t max_msgs) {
        if (sq.fd < 0) sq.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        sq.max_msgs = max_msgs;
        return sq.fd;
    }
    /* called with the lock held */
    static int sq_push_locked(int kind, int64_t sid, natsMsg *msg, natsStatus status) {
        if (sq.count == sq.cap) {
            size_t cap = sq.cap ? sq.cap * 2 : 1024;
            sq_entry *items = realloc(sq.items, cap * sizeof(sq_entry));
            if (items == NULL) return -1;
            sq.items = items; sq.cap = cap;
        }
        sq.items[sq.count].kind = kind; sq.items[sq.count].sid = sid;
        sq.items[sq.count].msg = msg; sq.items[sq.count].status = status;
        sq.count++;
        if (sq.count == 1) { uint64_t one = 1; ssize_t w = write(sq.fd, &one, sizeof one); (void)w; }
        return 0;
    }
    static void sq_push(int kind, int64_t sid, natsMsg *msg, natsStatus status) {
        pthread_mutex_lock(&sq.lock);
        if (kind == EV_MSG && sq.msgs >= sq.max_msgs) {
            sq.dropped++;
            pthread_mutex_unlock(&sq.lock);
            natsMsg_Destroy(msg);
            return;
        }
        if (sq_push_locked(kind, sid, msg, status) == 0) {
            if (kind == EV_MSG) sq.msgs++;
        } else if (msg != NULL) {
            sq.dropped++;
            natsMsg_Destroy(msg);
        }
        pthread_mutex_unlock(&sq.lock);
    }
    /* Take everything queued: the caller owns *items (free it) */
    static size_t sq_take(sq_entry **items, int64_t *dropped) {
        uint64_t n; ssize_t r = read(sq.fd, &n, sizeof n); (void)r;
        pthread_mutex_lock(&sq.lock);
        size_t count = sq.count;
        *items = sq.items; *dropped = sq.dropped;
        sq.items = NULL; sq.count = sq.cap = 0; sq.msgs = 0; sq.dropped = 0;
        pthread_mutex_unlock(&sq.lock);
        return count;
    }
    static void sq_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
        (void)nc; (void)sub;
        sq_push(EV_MSG, (int64_t)(intptr_t)closure, msg, 0);
    }
    static void sq_on_connected(natsConnection *nc, void *c) { (void)nc; (void)c; sq_push(EV_CONNECTED, 0, NULL, 0); }
    static void sq_on_reconnected(natsConnection *nc, void *c) { (void)nc; (void)c; sq_push(EV_RECONNECTED, 0, NULL, 0); }
    static void sq_on_disconnected(natsConnection *nc, void *c) { (void)nc; (void)c; sq_push(EV_DISCONNECTED, 0, NULL, 0); }
    static void sq_on_closed(natsConnection *nc, void *c) { (void)nc; (void)c; sq_push(EV_CLOSED, 0, NULL, 0); }
    static void sq_on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *c) {
        (void)nc; (void)sub; (void)c;
        sq_push(err == NATS_SLOW_CONSUMER ? EV_SLOW : EV_ERROR, 0, NULL, err);
    }
    """
    enum:
        EV_MSG
        EV_CONNECTED
        EV_RECONNECTED
        EV_DISCONNECTED
        EV_CLOSED
        EV_SLOW
        EV_ERROR
    ctypedef struct sq_entry:
        int kind
        int64_t sid
        natsMsg *msg
        natsStatus status
    int sq_open(size_t max_msgs)
    size_t sq_take(sq_entry **items, int64_t *dropped) nogil
    void sq_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) nogil
    void sq_on_connected(natsConnection *nc, void *c) nogil
    void sq_on_reconnected(natsConnection *nc, void *c) nogil
    void sq_on_disconnected(natsConnection *nc, void *c) nogil
    void sq_on_closed(natsConnection *nc, void *c) nogil
    void sq_on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *c) nogil

#: Messages queued between nats.c's delivery thread and the link's thread;
#: beyond it they are dropped and counted (as a slow consumer's).
QUEUE_MAX = 65536
cdef enum:
    URL_MAX = 256  # the longest server URL asked of nats.c
    CHECK_TEXT = 200  # the longest reason ``private_parts`` gives
    BLOCK_MAX = 1024  # the longest header section built here (the envelope's is < 900)

#: The one header the link reads and writes (``protocol.natsenvelope.HEADER``).
cdef bytes _KEY = b"Sbus-Origin"
cdef bytes _HEAD = b"NATS/1.0\r\n" + _KEY + b": "
cdef bytes _TAIL = b"\r\n\r\n"
cdef Py_ssize_t _HEAD_LEN = len(_HEAD)
cdef Py_ssize_t _TAIL_LEN = len(_TAIL)

cdef bint _private = False  # the private parts are used (``private_parts``)
cdef bint _allowed = True  # (``keep_to_public_api``)


def private_parts():
    """'' if the installed libnats is one whose private parts the link uses
    (``natsc_private.h``), else why not, in one line (the engine then keeps to
    the public API, slower).  Checked again at each call."""
    global _private
    cdef char out[CHECK_TEXT]
    _private = natsc_private_check(out, CHECK_TEXT) != 0
    why = out[:strlen(out)].decode("utf-8", "replace")
    if _private and not _allowed:
        _private = False
        why = "kept to the public API (keep_to_public_api)"
    return why


def keep_to_public_api(bint on):
    """Use only the public API from now on (``on``), as on a libnats the link
    does not know: the tests run both ways."""
    global _allowed
    _allowed = not on
    private_parts()


class NatsError(Exception):
    """A nats.c call failed: its status text."""


cdef _check(natsStatus s, str what):
    if s != NATS_OK:
        raise NatsError("%s: %s" % (what, natsStatus_GetText(s).decode()))


cdef class Subscription:
    cdef natsSubscription *sub

    def __dealloc__(self):
        if self.sub != NULL:
            natsSubscription_Destroy(self.sub)


_owner = None  # the Client that owns the process's one queue


cdef class Client:
    """One natsConnection; ``fileno()`` is readable when ``drain`` has work."""

    cdef natsConnection *nc
    cdef natsOptions *opts
    cdef dict subs
    cdef public bint retrying  # the first connect failed: nats.c retries by itself

    def __cinit__(self):
        self.nc = NULL
        self.opts = NULL
        self.subs = {}

    def __init__(self, list servers, str name, int64_t reconnect_ms, int64_t timeout_ms,
                 int64_t ping_ms, int pings, int pending_bytes, user=None, password=None,
                 token=None, creds=None, bint tls=False, tls_ca=None, bint ordered=False):
        global _owner
        if _owner is not None:
            raise NatsError("one nats.c client per process")
        _check(nats_Open(-1), "nats_Open")
        private_parts()
        nats_SetMessageDeliveryPoolSize(1)
        if sq_open(QUEUE_MAX) < 0:
            raise OSError("eventfd failed")
        _check(natsOptions_Create(&self.opts), "options")
        encoded = [s.encode() for s in servers]
        cdef const char **urls = <const char **>PyMem_Malloc(len(encoded) * sizeof(char *))
        cdef int i
        for i in range(len(encoded)):
            urls[i] = encoded[i]
        try:
            _check(natsOptions_SetServers(self.opts, urls, len(encoded)), "servers")
        finally:
            PyMem_Free(urls)
        o = self.opts
        _check(natsOptions_SetName(o, name.encode()), "name")
        _check(natsOptions_SetNoEcho(o, True), "no echo")
        _check(natsOptions_SetNoRandomize(o, ordered), "server order")
        _check(natsOptions_SetAllowReconnect(o, True), "reconnect")
        _check(natsOptions_SetMaxReconnect(o, -1), "reconnect")
        _check(natsOptions_SetReconnectWait(o, reconnect_ms), "reconnect wait")
        _check(natsOptions_SetTimeout(o, timeout_ms), "timeout")
        _check(natsOptions_SetPingInterval(o, ping_ms), "ping interval")
        _check(natsOptions_SetMaxPingsOut(o, pings), "pings")
        _check(natsOptions_SetReconnectBufSize(o, pending_bytes), "reconnect buffer")
        _check(natsOptions_UseGlobalMessageDelivery(o, True), "delivery")
        _check(natsOptions_SetRetryOnFailedConnect(o, True, sq_on_connected, NULL), "retry")
        _check(natsOptions_SetDisconnectedCB(o, sq_on_disconnected, NULL), "callback")
        _check(natsOptions_SetReconnectedCB(o, sq_on_reconnected, NULL), "callback")
        _check(natsOptions_SetClosedCB(o, sq_on_closed, NULL), "callback")
        _check(natsOptions_SetErrorHandler(o, sq_on_error, NULL), "callback")
        if user is not None:
            _check(natsOptions_SetUserInfo(o, user.encode(), password.encode()), "user")
        if token is not None:
            _check(natsOptions_SetToken(o, token.encode()), "token")
        if creds is not None:
            _check(natsOptions_SetUserCredentialsFromFiles(o, creds.encode(), NULL), "creds")
        if tls:
            _check(natsOptions_SetSecure(o, True), "tls")
            if tls_ca is not None:
                _check(natsOptions_LoadCATrustedCertificates(o, tls_ca.encode()), "tls_ca")
        _owner = self

    def fileno(self):
        return sq_open(QUEUE_MAX)

    def connect(self):
        """Connect (blocks for the first attempt: call it off the loop); with
        no server answering, nats.c goes on trying by itself (``retrying``)."""
        cdef natsStatus s
        with nogil:
            s = natsConnection_Connect(&self.nc, self.opts)
        if s == NATS_NOT_YET_CONNECTED:
            self.retrying = True
            return False
        _check(s, "connect")
        return True

    def server(self):
        cdef char buf[URL_MAX]
        if self.nc == NULL or natsConnection_GetConnectedUrl(self.nc, buf, URL_MAX) != NATS_OK:
            return ""
        return buf[:strlen(buf)].decode("utf-8", "replace")

    def publish(self, list batch):
        """Each (subject, envelope, payload) of ``batch``, in order, then
        written; how many were refused."""
        cdef int refused = 0
        cdef bytes subject, payload
        cdef object envelope
        if self.nc == NULL:
            return len(batch)
        for subject, envelope, payload in batch:
            if _publish_one(self.nc, subject, envelope, payload) != NATS_OK:
                refused += 1
        if _private:
            natsc_write_now(self.nc)  # (else nats.c's flusher writes it, 1 ms later)
        return refused

    def subscribe(self, int64_t sid, bytes subject, int msgs, int nbytes):
        """A subscription whose messages are queued under ``sid``; limits -1: none."""
        cdef Subscription box = Subscription()
        _check(natsConnection_Subscribe(&box.sub, self.nc, subject, sq_on_msg, <void *><long>sid),
               "subscribe")
        _check(natsSubscription_SetPendingLimits(box.sub, msgs, nbytes), "pending limits")
        self.subs[sid] = box

    def unsubscribe(self, int64_t sid):
        cdef Subscription box = self.subs.pop(sid, None)
        if box is not None:
            natsSubscription_Unsubscribe(box.sub)  # fails only on a closed connection

    def flush(self, double timeout):
        """Everything handed over so far written, then a PING and its PONG
        (blocks: call it off the loop); False if the PONG did not come."""
        cdef natsStatus s
        cdef int64_t ms = <int64_t>(timeout * 1000)
        if self.nc == NULL:
            return False
        with nogil:
            s = natsConnection_FlushTimeout(self.nc, ms)
        return s == NATS_OK

    def drain(self, sink):
        """Hand what nats.c's threads queued to ``sink``, in order (the link's thread)."""
        cdef sq_entry *items = NULL
        cdef int64_t dropped = 0
        cdef size_t n, i
        cdef sq_entry *e
        cdef const char *data
        cdef bytes subject, payload  # copies, made before the message is destroyed
        cdef object envelope
        n = sq_take(&items, &dropped)
        try:
            for i in range(n):
                e = &items[i]
                if e.kind == EV_MSG:
                    subject = natsMsg_GetSubject(e.msg)
                    data = natsMsg_GetData(e.msg)
                    payload = PyBytes_FromStringAndSize(data, natsMsg_GetDataLength(e.msg))
                    envelope = _envelope(e.msg)
                    _destroy(e.msg)
                    e.msg = NULL
                    sink.on_message(e.sid, subject, envelope, payload)
                elif e.kind == EV_CONNECTED:
                    self.retrying = False
                    sink.on_connected(self.server(), False)
                elif e.kind == EV_RECONNECTED:
                    sink.on_connected(self.server(), True)
                elif e.kind == EV_DISCONNECTED:
                    sink.on_disconnected()
                elif e.kind == EV_SLOW:
                    sink.on_slow_consumer(1)
                elif e.kind == EV_ERROR:
                    sink.on_error(natsStatus_GetText(e.status).decode())
            if dropped:
                sink.on_slow_consumer(dropped)
        finally:
            for i in range(n):
                if items[i].msg != NULL:
                    _destroy(items[i].msg)
            free(items)

    def close(self):
        """Close the connection (blocks briefly: call it off the loop)."""
        global _owner
        self.subs.clear()
        if self.nc != NULL:
            with nogil:
                natsConnection_Close(self.nc)
                natsConnection_Destroy(self.nc)
            self.nc = NULL
        if self.opts != NULL:
            natsOptions_Destroy(self.opts)
            self.opts = NULL
        _owner = None


cdef natsStatus _publish_one(natsConnection *nc, bytes subject, object envelope, bytes payload):
    """One message, with the envelope ``envelope`` (a str; None: no header)."""
    cdef natsc_msg m
    cdef natsMsg *made = NULL
    cdef natsStatus s
    cdef char block[BLOCK_MAX]
    cdef bytes value
    cdef Py_ssize_t n
    if envelope is None:
        return natsConnection_Publish(nc, subject, <const char *>payload, len(payload))
    n = PyUnicode_GET_LENGTH(envelope)
    if _private and PyUnicode_IS_ASCII(envelope) and _HEAD_LEN + n + _TAIL_LEN <= BLOCK_MAX:
        # the header section encoded here, published as it is (natsc_private.h, 1.)
        memcpy(block, PyBytes_AS_STRING(_HEAD), _HEAD_LEN)
        memcpy(block + _HEAD_LEN, PyUnicode_DATA(envelope), n)
        memcpy(block + _HEAD_LEN + n, PyBytes_AS_STRING(_TAIL), _TAIL_LEN)
        natsc_msg_init(&m, subject, block, <int>(_HEAD_LEN + n + _TAIL_LEN),
                       <const char *>payload, <int>len(payload))
        return natsConnection_PublishMsg(nc, <natsMsg *>&m)
    value = (<str>envelope).encode("ascii")
    s = natsMsg_Create(&made, subject, NULL, <const char *>payload, <int>len(payload))
    if s == NATS_OK:
        s = natsMsgHeader_Set(made, _KEY, value)
    if s == NATS_OK:
        s = natsConnection_PublishMsg(nc, made)
    if made != NULL:
        natsMsg_Destroy(made)
    return s


cdef object _envelope(natsMsg *msg):
    """The envelope of a received message (a str), or None."""
    cdef const char *value = NULL
    cdef const char *block
    cdef int n = 0, i
    cdef int first, last
    if _private:
        block = natsc_msg_block(msg, &n)
        if block == NULL:
            return None  # no header section at all
        # the section a bus writes: exactly ``_HEAD <value> _TAIL`` (natsc_private.h, 2.);
        # its value plain ASCII, no space at either end (as nats.c would trim)
        first = _HEAD_LEN
        last = n - _TAIL_LEN
        if (last > first and memcmp(block, PyBytes_AS_STRING(_HEAD), _HEAD_LEN) == 0
                and memcmp(block + last, PyBytes_AS_STRING(_TAIL), _TAIL_LEN) == 0
                and block[first] != 32 and block[last - 1] != 32):
            for i in range(first, last):
                if block[i] < 32 or block[i] > 126:
                    break
            else:
                return PyUnicode_DecodeASCII(block + first, last - first, NULL)
    # any other section (a native client's headers...): read the general way
    if natsMsgHeader_Get(msg, _KEY, &value) != NATS_OK or value == NULL:
        return None
    return value[:strlen(value)].decode("utf-8", "replace")


cdef inline void _destroy(natsMsg *msg):
    if _private:
        natsc_msg_free_now(msg)  # (natsc_private.h, 3.)
    else:
        natsMsg_Destroy(msg)
