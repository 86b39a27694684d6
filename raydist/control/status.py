"""The one mapping from raydist's exceptions to gRPC status codes, and back."""

from __future__ import annotations

import grpc

from raydist import errors

__all__ = ["code_for", "CODES"]

#: Most specific class first.
CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (errors.SpecError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.CapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.QuotaExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.LinkPortsInUseError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.ClusterNotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.JobNotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.ClusterExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.NodeStartTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ClusterFailedError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ClusterNotReadyError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ConnectionInUseError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.DataFormatError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ControlPlaneUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.RaydistError, grpc.StatusCode.INTERNAL),
]


def code_for(exc: BaseException) -> grpc.StatusCode:
    for cls, code in CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL
