"""Typed errors. Every layer raises these; the gRPC edge maps them to status codes in one place."""

EXCERPT = 120  # characters of a client's value an error echoes


def excerpt(value, limit: int = EXCERPT) -> str:
    """repr() of a client's value cut to `limit` characters: errors name what was sent without
    echoing megabytes of it back (a 100 KB name passed gRPC's metadata limit as a status message)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"... ({len(text)} characters)"



class MinferdError(Exception):
    """Base of every error minferd raises on purpose."""


class ModelFileError(MinferdError):
    """A GGUF file that cannot be loaded: names the file and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class InvalidRequest(MinferdError):
    """A request or argument that is wrong in itself (bad sampling parameter, empty prompt, ...)."""


class NotFound(MinferdError):
    """No such model (or file)."""


class Conflict(MinferdError):
    """The request contradicts the daemon's state (a name in use, a model busy)."""


class PermissionDenied(MinferdError):
    """A path outside the configured model directories."""


class Aborted(MinferdError):
    """A request ended by the daemon, not the client: its model was unloaded while it waited or ran."""


class Busy(MinferdError):
    """More requests at once than the daemon takes: try again later (a queue that is full)."""
