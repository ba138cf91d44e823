"""Session 48: the session socket under a hostile client, against a real daemon (tiny model, CPU):
300 connections past the 224 places (refused at once, GetStatus stays quick), a frame's header
sent in part then silence (closed after FRAME_S), a hello never sent (closed after HELLO_S), and
the daemon's threads back where they were once all are closed."""
import socket, struct, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import psutil
from minferd._proto import pb2, pb2_grpc
from minferd.spawn import start_daemon, stop_daemon
import grpc

d = tempfile.mkdtemp()
info = start_daemon(Path(d), ["--device", "cpu", "--preload", "/tmp/tiny.gguf=tiny", "--threads", "1"])
path = d + "/d.sock.session"
proc = psutil.Process(info["pid"])
stub = pb2_grpc.MinferdStub(grpc.insecure_channel(info["address"]))
def status_ms():
    t = time.perf_counter(); stub.GetStatus(pb2.GetStatusRequest(), timeout=10); return (time.perf_counter() - t) * 1e3
status_ms()
base = proc.num_threads()
conns = []
for _ in range(300):
    s = socket.socket(socket.AF_UNIX); s.connect(path); conns.append(s)
time.sleep(1.0)
refused = 0
for s in conns:
    s.settimeout(0.01)
    try:
        if s.recv(4, socket.MSG_PEEK): refused += 1
    except (TimeoutError, BlockingIOError):
        pass
print(f"300 connections: {refused} refused at once, daemon threads {base} -> {proc.num_threads()}, GetStatus {status_ms():.1f} ms")
t0 = time.monotonic()
for s in conns: s.settimeout(30)
# no hello: every held one is closed after HELLO_S
closed = 0
for s in conns:
    try:
        while s.recv(4096): pass
    except OSError:
        pass
    closed += 1
print(f"no hello: all {closed} closed after {time.monotonic() - t0:.1f} s")
for s in conns: s.close()
s = socket.socket(socket.AF_UNIX); s.connect(path); s.sendall(struct.pack("<I", 0))  # hello
s.sendall(b"\x10\x00")  # half a header, then silence
t0 = time.monotonic(); s.settimeout(60)
got = s.recv(4096)
print(f"half a header: closed after {time.monotonic() - t0:.1f} s ({len(got)} bytes back)")
s.close()
time.sleep(2.0)
print(f"daemon threads after: {proc.num_threads()} (before {base}); GetStatus {status_ms():.1f} ms")
stop_daemon(info["pid"])
