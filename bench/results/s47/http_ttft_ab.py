"""Session 47, CPU (this 2-core machine): the HTTP front's time to its first SSE chunk against a gRPC
Session's first event, in one daemon (the tiny qwen2, 1-token requests of 3 ids, medians of 300 after 30).
Run in turns with minferd/http_api.py as of 4d1d63b ("old") and as of the next commit ("new"):
    for v in old new old new; do cp http_api_$v.py minferd/http_api.py; python bench/results/s47/http_ttft_ab.py; done
http_ttft_ab.log has what it printed."""
import sys, tempfile, time, json, statistics, http.client, socket
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from minferd.spawn import start_daemon, stop_daemon
from minferd.client import Client
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
d = Path(tempfile.mkdtemp())
st = start_daemon(d, ["--device", "cpu", "--preload", "/tmp/tiny.gguf=tiny", "--http", f"127.0.0.1:{port}", "--insecure"])
try:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0, "stream": True})
    def http_first():
        t = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = r0 = conn.getresponse()
        line = r.readline()
        while not line.startswith(b"data:"):
            line = r.readline()
        t1 = time.perf_counter()
        r.read()
        return (t1 - t) * 1e3
    c = Client(st["address"])
    def grpc_first():
        t = time.perf_counter(); first = []
        c._request("generate", c.pb.GenerateRequest(model="tiny", ids=c.pb.TokenIds(ids=[5, 6, 7]),
                   sampling=c.pb.SamplingParams(temperature=0, max_tokens=1)), lambda e: first.append(time.perf_counter()))
        return (first[0] - t) * 1e3
    for f in (http_first, grpc_first): [f() for _ in range(30)]
    for _ in range(2):
        h = [http_first() for _ in range(300)]; g = [grpc_first() for _ in range(300)]
        print("http first chunk %.2f ms, grpc session first event %.2f ms" % (statistics.median(h), statistics.median(g)))
finally:
    stop_daemon(st["pid"])
