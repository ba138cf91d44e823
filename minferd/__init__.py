"""minferd: several quantized GGUF models co-resident on one GPU, served over gRPC."""
import os as _os

# grpcio >= 1.81 restarts its poller in a forked child that subprocess.Popen has already closed
# the fds of, and the child aborts before exec (grpc/grpc#43055: "epoll_wait error: Bad file
# descriptor", exit -6). The pytest plugin and the tests start daemons from processes that use
# gRPC; nothing here forks a process that goes on using gRPC, so fork support is not needed.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
__version__ = "0.1.0"
