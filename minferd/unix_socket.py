"""The daemon's unix socket: which --listen values name one, binding it owner-only without ever
replacing what is not a stale socket, and letting go of it only while it is still ours.

gRPC unlinks the path it bound when its server stops, whatever socket is there by then: a daemon
started while the old one drained lost its socket when the old one exited. So gRPC binds a
private name beside the path and the socket is then hard-linked into place (link(2) fails where
the path exists, so nothing is replaced); gRPC's own unlink at stop finds nothing."""
from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass

from minferd.errors import InvalidRequest, excerpt

SUN_PATH_MAX = 107  # bytes of a unix socket path (sun_path is 108, NUL included)
_KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link",
          stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def session_path(grpc_path: str) -> str | None:
    """Where the session socket (session_socket.py) of a daemon listening on unix socket
    `grpc_path` lives; None where the name would not fit a unix socket path."""
    path = grpc_path + ".session"
    return path if len(os.fsencode(path)) <= SUN_PATH_MAX else None


def unix_path(listen: str) -> str | None:
    """unix:///abs, unix:/abs and unix:relative (to the working directory) -> an absolute path;
    None for host:port."""
    if not listen.startswith("unix:"):
        return None
    rest = listen[len("unix:"):]
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise InvalidRequest(f"--listen {excerpt(listen)}: unix:// takes an absolute path (unix:///run/x.sock); "
                                 f"write unix:PATH for a relative one")
    if not rest:
        raise InvalidRequest(f"--listen {excerpt(listen)}: no socket path")
    path = os.path.abspath(rest)
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise InvalidRequest(f"socket path {excerpt(path)} is {len(os.fsencode(path))} bytes; a unix socket path "
                             f"holds at most {SUN_PATH_MAX}")
    return path


@dataclass(frozen=True, slots=True)
class BoundSocket:
    path: str
    dev: int
    ino: int

    def is_still_ours(self) -> bool:
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)

    def release(self) -> None:
        """Unlink the path only if it is still the socket this daemon bound: a successor that
        started while this one drained keeps its own."""
        if self.is_still_ours():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def make_parent(path: str) -> None:
    parent = os.path.dirname(path)
    if os.path.isdir(parent):
        return  # an existing directory is the operator's: its mode is left alone
    old = os.umask(0o077)  # every directory made here is 0700 (makedirs' mode= covers only the last)
    try:
        os.makedirs(parent, exist_ok=True)
    finally:
        os.umask(old)


def clear_stale(path: str) -> None:
    """Nothing at the path, or a stale socket (connect refused) that is removed; anything else is
    refused and left exactly as it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a socket")
        raise InvalidRequest(f"{path} exists and is {kind}, not a socket: refusing to replace it "
                             f"(move it away or --listen elsewhere)")
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # a daemon that was killed left it: nobody listens
    except FileNotFoundError:
        pass
    except OSError as e:
        raise InvalidRequest(f"{path}: {e.strerror}") from None
    else:
        raise InvalidRequest(f"another daemon is listening on {path}")
    finally:
        probe.close()


def bind(server, path: str) -> BoundSocket:
    """Bind `server` (grpc.Server) on the unix socket `path`, mode 0600 from its first instant."""
    make_parent(path)
    clear_stale(path)
    private = os.path.join(os.path.dirname(path), f".minferd-{os.getpid()}.sock")
    if len(os.fsencode(private)) > SUN_PATH_MAX:
        private = os.path.join(os.path.dirname(path), f".m{os.getpid()}")
    old = os.umask(0o177)
    try:
        if not server.add_insecure_port("unix:" + private):
            raise InvalidRequest(f"cannot listen on unix:{path}")
    finally:
        os.umask(old)
    try:
        os.link(private, path)
    except FileExistsError:
        raise InvalidRequest(f"{path} appeared while the daemon bound it: refusing to replace it") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise InvalidRequest(f"cannot listen on unix:{path}: {e.strerror}") from None
        os.rename(private, path)  # a file system without hard links: checked free a moment ago
    else:
        os.unlink(private)
    st = os.lstat(path)
    os.chmod(path, 0o600)  # already 0600 through the umask; says so for any umask gRPC may apply
    return BoundSocket(path, st.st_dev, st.st_ino)
