"""A client for `tessera serve`: distributed semaphores, locks, rate limits and admissions
over HTTP, standard library only.

::

    import tessera_client

    client = tessera_client.Client("http://127.0.0.1:8080")
    with client.lock("nightly-report").acquire(timeout=10) as lease:
        make_report(fence=lease.fence)          # lease.lost is set if the lease is lost

    sms = client.rate("sms-api", "50/s", "1000/min")
    sms.acquire()                               # returns at the admitted moment
    send_message()

The asyncio API has the same names in :mod:`tessera_client.aio`.
"""

from . import aio
from ._lease import AdmittedLease, Lease
from ._transport import __version__
from .client import Admission, Client, Decision, RateLimiter, Semaphore, TenantLimits
from .errors import (
    CapacityMismatch,
    ConnectionFailed,
    Corrupt,
    Forbidden,
    Internal,
    InvalidInput,
    LeaseGone,
    Limited,
    MethodNotAllowed,
    NoPermit,
    NotAdmitted,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    RateMismatch,
    ShuttingDown,
    StoreUnavailable,
    TesseraError,
    Unauthorized,
    Unavailable,
    Unsupported,
    UnsupportedMediaType,
)

__all__ = [
    "__version__",
    "aio",
    "Client",
    "Semaphore",
    "RateLimiter",
    "Admission",
    "Decision",
    "TenantLimits",
    "Lease",
    "AdmittedLease",
    "TesseraError",
    "InvalidInput",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "NoPermit",
    "NotAdmitted",
    "CapacityMismatch",
    "RateMismatch",
    "LeaseGone",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "QueueFull",
    "Limited",
    "Corrupt",
    "Internal",
    "Unsupported",
    "Unavailable",
    "StoreUnavailable",
    "ShuttingDown",
    "ConnectionFailed",
]
