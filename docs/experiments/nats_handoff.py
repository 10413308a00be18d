"""Hand-off between the gevent hub and an asyncio loop: a thread of its own vs asyncio-gevent.
Ping-pong latency and one-way throughput through a SEQPACKET socket pair."""
import asyncio, socket, sys, threading, time
import gevent, gevent.socket

MODE = sys.argv[1]
N_PING, N_FLOW = 20000, 200000

async def echo(sock, count_only):
    loop = asyncio.get_running_loop()
    ev = asyncio.Event()
    loop.add_reader(sock.fileno(), ev.set)
    n = 0
    while True:
        await ev.wait(); ev.clear()
        while True:
            try:
                p = sock.recv(65536)
            except BlockingIOError:
                break
            if p == b"end" or not p:
                loop.remove_reader(sock.fileno()); sock.send(b"%d" % n); return
            n += 1
            if not count_only:
                sock.send(p)

def run(count_only):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)
    if MODE == "thread":
        t = threading.Thread(target=lambda: asyncio.run(echo(b, count_only))); t.start()
    else:
        import asyncio_gevent
        asyncio.set_event_loop_policy(asyncio_gevent.EventLoopPolicy())
        t = gevent.spawn(lambda: asyncio.run(echo(b, count_only)))
    g = gevent.socket.socket(fileno=a.detach())
    if count_only:
        t0 = time.perf_counter()
        for i in range(N_FLOW):
            g.send(b"x" * 100)
        g.send(b"end"); n = int(g.recv(100)); dt = time.perf_counter() - t0
        print(f"{MODE}: one-way {n / dt:,.0f} packets/s")
    else:
        lat = []
        for i in range(N_PING):
            t0 = time.perf_counter_ns(); g.send(b"x" * 100); g.recv(200); lat.append(time.perf_counter_ns() - t0)
        g.send(b"end"); g.recv(100)
        lat.sort()
        print(f"{MODE}: round trip p50 {lat[len(lat)//2]/1000:.1f} us, p99 {lat[int(len(lat)*.99)]/1000:.1f} us")
    t.join()

run(False); run(True)
