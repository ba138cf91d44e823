"""Daemon settings: command-line flags over MINFERD_* environment over an optional TOML file."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, fields

from minferd.errors import InvalidRequest, excerpt

# ---- one home for each constant ------------------------------------------------------------
DEFAULT_CTX = 4096  # a load's KV length when it asks for none (capped at the model's training context)
KV_BLOCK_TOKENS = 32  # positions per KV block: the unit of paging and of prefix reuse
DEFAULT_PARALLEL = 1  # a load's KV holds this many full contexts when it asks for no size (Ollama's NUM_PARALLEL):
# paged, one context of KV serves any number of shorter requests at once
MAX_RUNNING_SEQS = 256  # sequences one model decodes at once (the largest decode-graph bucket)
DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays; 0 unloads when idle, negative keeps forever
W16_MIN_BYTES = 2 << 30  # the seeds' W16_ENABLE_BYTES: smaller models keep their quantized footprint
# SIGTERM: how long in-flight requests may run on before the daemon exits. deploy/ gives the
# daemon a 75 s grace (TimeoutStopSec, terminationGracePeriodSeconds) and passes
# --drain-seconds 60: the drain must end, and the models unload, before the SIGKILL.
DRAIN_SECONDS = 30.0
MIN_TOKEN_CHARS = 16  # a shorter bearer token is refused at start (`openssl rand -hex 16` gives 32)
HEALTH_WATCH_SECONDS = 1.0  # how soon a Watch of model/<name> hears that the model came or went
SERVE_TICK_SECONDS = 1.0  # the serve loop reaps expired models and looks for --parent-pid this often
COMPUTE_NICE = 5  # added to the nice value of threads that compute (minferd/priority.py says why 5)
GIL_SWITCH_SECONDS = 0.0005  # the daemon's sys.setswitchinterval (Python's default: 5 ms)
METRICS_HOST = "127.0.0.1"  # --metrics-port's address; another one needs --metrics-listen and a token

# Bounds on what a client may send, checked before any work; errors echo at most EXCERPT chars.
MAX_NAME_CHARS = 128  # a model name
MAX_PATH_BYTES = 4096  # a LoadModel path (PATH_MAX)
MAX_PATH_PARTS = 256  # components of a LoadModel path (realpath's cost grows with their square)
MAX_TOKENIZE_BYTES = 4 << 20  # Tokenize's text
MAX_DETOKENIZE_IDS = 1 << 18  # Detokenize's ids
MAX_CHAT_MESSAGES = 4096  # messages in one Chat
MAX_LISTED_FILES = 1000  # model files ListAvailable reads (each a header parse)
MAX_HTTP_BODY_BYTES = 16 << 20  # an HTTP request's JSON (gRPC's --max-message-bytes default)
# Generations in progress on the HTTP front (Ollama's OLLAMA_MAX_QUEUE is 512); past it a request
# gets 429 at once. Each one waits for its tokens in a thread of its own pool of this size, so no
# number of them can starve the front's other endpoints.
HTTP_MAX_REQUESTS = 512
GRPC_MAX_STREAMS = 224  # Generate/Chat/Session streams at once: of gRPC's 256 threads, 32 stay for the rest
# A Session waiting this long for its next request is ended (CANCELLED): it holds a stream place
# and a thread while it waits. A test suite's pauses between requests are far shorter.
SESSION_IDLE_SECONDS = 60.0
TEMPLATE_STEPS = 2_000_000  # lines a chat template may execute in one render
TEMPLATE_SECONDS = 2.0  # and wall time
MAX_RENDERED_BYTES = 8 << 20  # what one render may produce
# A model file's chat template, compiled once at load: real ones are a few KB (tool-calling ones up to
# ~20 KB); a dense 64 KiB one compiles in ~1 s on 2 cores, a 1 MiB one took 26 s.
MAX_TEMPLATE_BYTES = 64 << 10
MAX_HEADER_BYTES = 256 << 20  # a GGUF's metadata and tensor table (the real gemma3's: 6.5 MB)

# ---- process-wide valves (MINFERD_* environment read at use, so tests can set them) -----------
VALVES = {
    "MINFERD_NO_W16CACHE": "1 forbids the f16 copy for every model",
    "MINFERD_FUSED_B": "1 plans every model FUSED_B",
    "MINFERD_PREFILL_KERNEL": "mmq | fused_b | tiles | small | tc: one kernel for every matmul past 8 rows it can run",
    "MINFERD_GATE_TABLE": "a prefill gate table measured on another GPU (bench/crossover.py --table)",
    "MINFERD_LOAD_PAUSE_S": "seconds a load waits after each tensor (tests: a file changes mid-load)",
    "MINFERD_SMALL_BATCH": "off: batches of 9-64 tokens skip mmq_small (the A/B of bench/profile_ops.py)",
    "MINFERD_ENGINE_NICE": "an integer added to a device backend's engine thread's nice value (5: lowered as CPU engines are; -5: raised, with CAP_SYS_NICE; the A/B of bench/latency.py under HOST_LOAD)",
    "MINFERD_TCGEMV_CONFIG": "a kernels/tcgemv.py CONFIGS key for every tcgemv launch (the A/B of bench/serve.py)",
    "MINFERD_GRAPH_ROWS": "1-256: steps of up to this many tokens replay a decode graph (the A/B of bench/latency.py)",
    "MINFERD_DEVICE_MOE": "0: MoE layers expert by expert with host routing (backend/moe.py) instead of device routing and grouped GEMMs (backend/cuda_moe.py)",
    "MINFERD_PENDING": "comma-separated names of backend/pending.py's waiting paths to run anyway (a device call's A/B before they land)",
    "MINFERD_IDS_CONFIGS": "a JSON file of mmvq_ids kernel shapes by type and class (bench/moe_ids.py --json): the A/B of a sweep's picks",
    "MINFERD_PDL": "graphs of at most this many rows launch their nodes programmatically (default 64; 0: none)",
    "MINFERD_RUN_AHEAD": "0: decode steps never run ahead of their tokens on the host; 1: they do even where the backend gains nothing (the CPU's: the tests') (engine.py)",
    "MINFERD_X_PLANES": "1: decode mat-vecs read one int8 plane of x (llama.cpp's q8_1 precision, ~0.5% per product) instead of two (~1e-5): fewer loads and dp4a a weight (the A/B of bench/latency.py)",
    "MINFERD_SESSION_SOCKET": "0: no session socket beside the daemon's unix socket (session_socket.py); clients then use gRPC's Session (the A/B of bench/latency.py)",
    "MINFERD_CALLER_STEPS": "0: a request never runs its first step on its own thread, even where its engine is idle (engine.py; the A/B of bench/latency.py)",
}


def valve(name: str, env=os.environ) -> str | None:
    """A MINFERD_* valve's value, or None where unset or empty."""
    if name not in VALVES:
        raise KeyError(f"{name} is not a minferd valve ({', '.join(VALVES)})")
    return env.get(name) or None


def default_socket() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    name = "minferd.sock" if os.environ.get("XDG_RUNTIME_DIR") else f"minferd-{os.getuid()}.sock"
    return "unix://" + os.path.join(base, name)


@dataclass(slots=True)
class ServeConfig:
    listen: str = field(default_factory=default_socket)  # unix:///path or host:port
    models_dirs: tuple[str, ...] = ()
    device: str = "auto"  # auto | cpu | cuda[:N]
    budget: str | None = None  # bytes ("40GiB") or a fraction ("0.9")
    preload: tuple[str, ...] = ()  # PATH[=NAME]
    metrics_port: int | None = None  # METRICS_HOST:PORT
    metrics_listen: str | None = None  # HOST:PORT
    http: str | None = None  # HOST:PORT of the OpenAI-compatible HTTP front
    http_max_requests: int = HTTP_MAX_REQUESTS
    max_streams: int = GRPC_MAX_STREAMS
    session_idle: float = SESSION_IDLE_SECONDS
    warmup: bool = False  # compile every kernel (minferd/warmup.py) before health says SERVING
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # PEM: TLS clients must present a certificate it signed
    token: str | None = None  # MINFERD_TOKEN or the TOML file only: never a flag (argv is public)
    token_file: str | None = None
    insecure: bool = False
    keep_alive: float = DEFAULT_KEEP_ALIVE
    parallel: int = DEFAULT_PARALLEL
    w16_min_bytes: int = W16_MIN_BYTES
    threads: int | None = None
    max_message_bytes: int = 16 << 20
    drain_seconds: float = DRAIN_SECONDS
    parent_pid: int | None = None  # drain and exit when this process is gone (the pytest plugin's)

    def bearer_token(self) -> str | None:
        """The checked token (minferd.auth's rules), or None where none is configured."""
        from minferd.auth import read_token
        return read_token(self.token, self.token_file)

    def http_address(self) -> tuple[str, int] | None:
        return host_port("--http", self.http) if self.http else None

    def metrics_address(self) -> tuple[str, int] | None:
        if self.metrics_listen and self.metrics_port is not None:
            raise InvalidRequest("give --metrics-listen HOST:PORT or --metrics-port PORT, not both")
        if self.metrics_port is not None:
            return METRICS_HOST, self.metrics_port
        return host_port("--metrics-listen", self.metrics_listen) if self.metrics_listen else None


def host_port(flag: str, value: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port), or InvalidRequest naming the flag."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"{flag} {excerpt(value)}: expected HOST:PORT")
    return host.strip("[]"), int(port)


_ENV = {"listen": str, "models_dirs": "paths", "device": str, "budget": str, "metrics_port": int, "http": str,
        "metrics_listen": str, "token": str, "token_file": str, "tls_cert": str, "tls_key": str,
        "tls_client_ca": str, "keep_alive": float, "parallel": int, "w16_min_bytes": int, "threads": int,
        "drain_seconds": float, "http_max_requests": int, "max_streams": int, "session_idle": float,
        "warmup": "flag"}


def load_config(flags: dict, env=os.environ, toml_path: str | None = None) -> ServeConfig:
    """flags: the parsed command line, None where not given."""
    values: dict = {}
    if toml_path:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise InvalidRequest("--config needs Python 3.11 or newer (tomllib)") from None
        try:
            with open(toml_path, "rb") as f:
                values.update(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidRequest(f"--config {toml_path}: {e}") from None
    for key, kind in _ENV.items():
        raw = env.get("MINFERD_" + key.upper())
        if raw is None:
            continue
        try:
            if kind == "paths":
                values[key] = tuple(p for p in raw.split(os.pathsep) if p)
            elif kind == "flag":
                values[key] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[key] = kind(raw)
        except ValueError:
            raise InvalidRequest(f"MINFERD_{key.upper()}={excerpt(raw)} is not a valid {kind.__name__}") from None
    values.update({k: v for k, v in flags.items() if v is not None and v != ()})
    known = {f.name for f in fields(ServeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidRequest(f"unknown setting(s) {', '.join(unknown)}")
    for k in ("models_dirs", "preload"):
        if k in values:
            values[k] = tuple(values[k])
    return ServeConfig(**values)
