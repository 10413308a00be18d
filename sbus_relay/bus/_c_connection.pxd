# Types for the compiled build of connection.py (sbus_relay.accel): the
# Python source is the one truth; this file only says what is a C type, so
# that the read -> match -> offer -> send loop runs without Python dispatch.
cimport cython

# (cimported under names of their own: the Python names stay the .py's imports)
from sbus_relay.protocol._c_index cimport SubscriptionIndex as CIndex
from sbus_relay.protocol._c_flood cimport OutboundQueue as CQueue
from sbus_relay.protocol._c_flood cimport decide, decide_reply, shedding_ends, still_blocked
from sbus_relay.protocol._c_episodes cimport Episode as CEpisode, Episodes as CEpisodes

from sbus_relay.protocol._c_scan cimport size_of
from sbus_relay.protocol._c_frames cimport is_batch, msg_key, unpack
# the base class: its Python name, since the class statement names it
from sbus_relay.protocol._c_session cimport Session

cdef bytes _BATCH
cdef object send_packed
cdef int BANG
cdef object _QUEUE
cdef object _WAIT_EMPTY
cdef object _WAIT_BELOW
cdef object _DISCONNECT_ACTION
cdef object _monotonic
cdef object recv_many
cdef object send_all
cdef object send_one
cdef object valid_key

cdef class Router:
    cdef public CIndex index
    cdef public object stats
    cdef public list dirty
    cdef public double now
    cdef public object log
    cdef public Py_ssize_t queue_bytes
    cdef public Py_ssize_t queue_messages
    cdef public object loop

    @cython.locals(conn=Connection)
    cpdef publish(self, Connection sender, bytes packet, bytes key)
    @cython.locals(conn=Connection, dirty=list)
    cpdef flush(self, Connection sender)

cdef class Notices:
    cdef public dict owed
    cdef public bint ready_owed

    cpdef add(self, bytes pattern, bint present)

cdef class Waiters:
    cdef public list held

    @cython.locals(keep=list, held=list)
    cpdef bint wake(self, CQueue q) except -1

cdef class Warnings:
    cdef public CEpisode dropping
    cdef public CEpisodes episodes
    cdef public object tick

cdef class _Rare:
    cdef public object log
    cdef public Notices notices
    cdef public list stash
    cdef public Waiters waiters
    cdef public Warnings warnings
    cdef public object write_watcher
    cdef public bint retry
    cdef public bint writing

# (fields by size, largest first: no padding between them; the Session part
# -- alive, ended, echo, interest, relay, packs, upward -- comes first)
cdef class Connection(Session):
    cdef _Rare _rare
    cdef object _read_watcher
    cdef public object account
    cdef public object handler
    cdef public str label
    cdef public list pending
    cdef public CQueue queue
    cdef public Router router
    cdef public str shed
    cdef public long long bytes_in
    cdef public long long bytes_out
    cdef public long long cid
    cdef public long long dropped
    cdef public long long msgs_in
    cdef public long long msgs_out
    cdef public long long pattern_bytes
    cdef public double since
    cdef public int fd
    cdef public int gid
    cdef public int pauses
    cdef public int pid
    cdef public int uid
    cdef public bint batch
    cdef public bint holding
    cdef public bint open

    cdef _Rare _more(self)
    @cython.locals(msgs=Py_ssize_t, nbytes=Py_ssize_t, done=Py_ssize_t,
                   packets=list, router=Router, packet=bytes, key=bytes, rare=_Rare)
    cpdef _on_readable(self)
    @cython.locals(n=Py_ssize_t, i=Py_ssize_t, packets=list, keys=list, router=Router)
    cdef Py_ssize_t _publish_batch(self, bytes frame) except -1
    cdef Py_ssize_t _send_list(self, list packets) except -1
    cpdef offer(self, bytes packet, Connection sender)
    @cython.locals(sent=Py_ssize_t, total=Py_ssize_t, i=Py_ssize_t)
    cpdef flush(self, Connection sender)
    cpdef deliver(self, bytes packet, Connection sender)
    cdef _count_drop(self, str reason)
    @cython.locals(rare=_Rare)
    cpdef drop(self, str reason)
    cdef Notices _owed(self)
    @cython.locals(rare=_Rare)
    cdef CEpisode _dropping(self)
    cdef Warnings _warnings(self)
    cpdef freeze(self)
    cpdef thaw(self)
    cpdef let_go(self)
    cpdef pause(self)
    cpdef resume(self)
    cdef _want_write(self)
    cdef CQueue _queue(self)
    @cython.locals(sent=Py_ssize_t, i=Py_ssize_t, now=double)
    cdef _send_queued(self, CQueue q)
    @cython.locals(rare=_Rare)
    cdef _room_made(self, CQueue q)
