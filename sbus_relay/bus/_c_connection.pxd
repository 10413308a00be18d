# Types for the compiled build of connection.py (sbus_relay.accel): the
# Python source is the one truth; this file only says what is a C type, so
# that the read -> match -> offer -> send loop runs without Python dispatch.
cimport cython

# (cimported under names of their own: the Python names stay the .py's imports)
from sbus_relay.protocol._c_index cimport SubscriptionIndex as CIndex
from sbus_relay.protocol._c_flood cimport OutboundQueue as CQueue
from sbus_relay.protocol._c_flood cimport decide, decide_reply, shedding_ends, still_blocked
from sbus_relay.protocol._c_episodes cimport Episode as CEpisode, Episodes as CEpisodes

from sbus_relay.protocol._c_scan cimport cut, find_byte, read_u32, size_of

cdef bytes _MSG
cdef int _NUL
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

cdef class Connection:
    cdef object __weakref__
    cdef CEpisode _dropping
    cdef CEpisodes _episodes
    cdef object _log
    cdef object _read_watcher
    cdef bint _retry
    cdef list _stash
    cdef object _tick
    cdef object _write_watcher
    cdef bint _writing
    cdef public object account
    cdef public bint alive
    cdef public bint batch
    cdef public long long bytes_in
    cdef public long long bytes_out
    cdef public long long cid
    cdef public int gid
    cdef public int uid
    cdef public int pid
    cdef public long long dropped
    cdef public bint echo
    cdef public str ended
    cdef public int fd
    cdef public object handler
    cdef public bint interest
    cdef public str label
    cdef public long long msgs_in
    cdef public long long msgs_out
    cdef public dict notices
    cdef public bint open
    cdef public bint holding
    cdef public bint packs
    cdef public long long pattern_bytes
    cdef public int pauses
    cdef public list pending
    cdef public CQueue queue
    cdef public bint ready_owed
    cdef public bint relay
    cdef public Router router
    cdef public str shed
    cdef public double since
    cdef public object sock
    cdef public bint upward
    cdef public list waiters

    @cython.locals(msgs=Py_ssize_t, nbytes=Py_ssize_t, done=Py_ssize_t, nul=Py_ssize_t,
                   packets=list, router=Router, packet=bytes)
    cpdef _on_readable(self)
    @cython.locals(offset=Py_ssize_t, end=Py_ssize_t, count=Py_ssize_t, size=Py_ssize_t,
                   nul=Py_ssize_t, packet=bytes, router=Router)
    cdef Py_ssize_t _unpack(self, bytes frame) except -1
    cdef Py_ssize_t _send_list(self, list packets) except -1
    cpdef offer(self, bytes packet, Connection sender)
    @cython.locals(sent=Py_ssize_t, total=Py_ssize_t, i=Py_ssize_t)
    cpdef flush(self, Connection sender)
    cpdef deliver(self, bytes packet, Connection sender)
    cdef _count_drop(self, str reason)
    cpdef drop(self, str reason)
    cpdef freeze(self)
    cpdef thaw(self)
    cpdef let_go(self)
    cpdef pause(self)
    cpdef resume(self)
    cdef _want_write(self)
    cdef CQueue _queue(self)
    @cython.locals(sent=Py_ssize_t, i=Py_ssize_t, now=double)
    cdef _send_queued(self, CQueue q)
