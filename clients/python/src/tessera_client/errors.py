"""The errors of `tessera serve`, one class per ``kind`` of its error body.

Every error answer of the server is ``{"kind": ..., "message": ...}`` with a fitting status.
:func:`from_answer` turns it into the class of that kind, so callers catch a class and never
match on a message::

    try:
        lease = client.lock("nightly").acquire(timeout=5)
    except tessera_client.NoPermit:
        ...                                    # held by someone else for 5 s
    except tessera_client.Unavailable as e:    # server or store unreachable
        print(e.kind, e.status, e.message)

Each error carries ``kind`` (the server's, or ``connection_failed`` when no answer came),
``status`` (the HTTP status, ``None`` without an answer), ``message`` (one line for a human,
never a token) and ``retry_after`` (seconds, for ``queue_full`` and ``limited``, else
``None``).
"""

from __future__ import annotations

import json


class TesseraError(Exception):
    """The base of every error this client raises for the server or the connection."""

    #: The kind this class stands for; instances carry the kind actually received.
    KIND = ""

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: str = kind if kind is not None else self.KIND
        self.status: int | None = status
        self.message: str = message
        self.retry_after: float | None = retry_after

    def __str__(self) -> str:
        where = f"{self.status} " if self.status is not None else ""
        return f"{where}{self.kind}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, status={self.status!r}, "
            f"message={self.message!r}, retry_after={self.retry_after!r})"
        )

    def is_timeout(self) -> bool:
        """Whether a wait ran out (``no_permit``, ``not_admitted``); nothing is held then."""
        return isinstance(self, (NoPermit, NotAdmitted))

    def is_lost(self) -> bool:
        """Whether the lease named by the request no longer exists (``lease_gone``)."""
        return isinstance(self, LeaseGone)

    def is_unavailable(self) -> bool:
        """Whether the server, its store or the connection failed; trying later may work."""
        return isinstance(self, Unavailable)


class InvalidInput(TesseraError):
    """400 ``invalid_input``: a value the server refuses (name, capacity, duration, limit…);
    nothing changed."""

    KIND = "invalid_input"


class Unauthorized(TesseraError):
    """401 ``unauthorized``: the server has ``--tokens`` and the token is missing or unknown."""

    KIND = "unauthorized"


class Forbidden(TesseraError):
    """403 ``forbidden``: the token does not cover this name."""

    KIND = "forbidden"


class NotFound(TesseraError):
    """404 ``not_found``: no such semaphore, limiter or route."""

    KIND = "not_found"


class MethodNotAllowed(TesseraError):
    """405 ``method_not_allowed``."""

    KIND = "method_not_allowed"


class NoPermit(TesseraError):
    """408 ``no_permit``: no permit within the wait; nothing is held or queued."""

    KIND = "no_permit"


class NotAdmitted(TesseraError):
    """408 ``not_admitted``: no admission within the wait; nothing is held, queued or charged."""

    KIND = "not_admitted"


class CapacityMismatch(TesseraError):
    """409 ``capacity_mismatch``: the stored capacity differs from the declared one."""

    KIND = "capacity_mismatch"


class RateMismatch(TesseraError):
    """409 ``rate_mismatch``: the stored limits (or margin, mode) differ from the declared ones."""

    KIND = "rate_mismatch"


class LeaseGone(TesseraError):
    """410 ``lease_gone``: the lease expired, was revoked or released."""

    KIND = "lease_gone"


class PayloadTooLarge(TesseraError):
    """413 ``payload_too_large``: a body above 64 KiB."""

    KIND = "payload_too_large"


class UnsupportedMediaType(TesseraError):
    """415 ``unsupported_media_type``."""

    KIND = "unsupported_media_type"


class QueueFull(TesseraError):
    """429 ``queue_full``: the semaphore's queue is full; ``retry_after`` says when to try."""

    KIND = "queue_full"


class Limited(TesseraError):
    """429 ``limited``: not admissible within the wait; ``retry_after`` is the exact wait
    (if nobody else comes first). Nothing was charged."""

    KIND = "limited"


class Corrupt(TesseraError):
    """500 ``corrupt``: the store holds data the server cannot read."""

    KIND = "corrupt"


class Internal(TesseraError):
    """500 ``internal``."""

    KIND = "internal"


class Unsupported(TesseraError):
    """501 ``unsupported``: the server's store lacks the feature (admissions on etcd, …)."""

    KIND = "unsupported"


class Unavailable(TesseraError):
    """The request did not get a usable answer: the store is unavailable, the server is
    stopping, or the connection failed. Trying again later may work."""

    KIND = "unavailable"


class StoreUnavailable(Unavailable):
    """503 ``store_unavailable``: the server could not reach its store in time."""

    KIND = "store_unavailable"


class ShuttingDown(Unavailable):
    """503 ``shutting_down``: the server is stopping."""

    KIND = "shutting_down"


class ConnectionFailed(Unavailable):
    """No answer: the connection could not be made, broke, or timed out (``status`` is None)."""

    KIND = "connection_failed"


KINDS: dict[str, type[TesseraError]] = {
    cls.KIND: cls
    for cls in (
        InvalidInput,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        NoPermit,
        NotAdmitted,
        CapacityMismatch,
        RateMismatch,
        LeaseGone,
        PayloadTooLarge,
        UnsupportedMediaType,
        QueueFull,
        Limited,
        Corrupt,
        Internal,
        Unsupported,
        StoreUnavailable,
        ShuttingDown,
    )
}


def from_answer(status: int, body: bytes, retry_after_header: str | None = None) -> TesseraError:
    """The error for an answer with a status of 400 or more.

    The class follows ``kind``; an unknown kind gives the base class (503 gives
    :class:`Unavailable`), and a body that is not the server's error JSON (a proxy's page)
    gives kind ``http_STATUS`` with the start of the body as message.
    """
    kind: str | None = None
    message = ""
    retry_after: float | None = None
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            kind = parsed.get("kind") if isinstance(parsed.get("kind"), str) else None
            message = str(parsed.get("message", ""))
            ms = parsed.get("retry_after_ms")
            if isinstance(ms, (int, float)):
                retry_after = ms / 1000.0
    except ValueError:
        pass
    if kind is None:
        kind = f"http_{status}"
        message = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
    if retry_after is None and retry_after_header is not None and retry_after_header.strip().isdigit():
        retry_after = float(retry_after_header.strip())
    cls = KINDS.get(kind)
    if cls is None:
        cls = Unavailable if status == 503 else TesseraError
    return cls(message, kind=kind, status=status, retry_after=retry_after)
