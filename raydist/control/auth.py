"""The control plane's authentication: who each RPC comes from.

Every RPC but health checks names its caller: a bearer token (the control
plane's own, or a tenant's) or, for a tenant configured by certificate
subject, its mTLS client certificate. An RPC with neither, or with a token
nobody holds, ends UNAUTHENTICATED before the servicer sees it. A known
caller is made current for the RPC (:func:`raydist.control.tenants.
current_caller`); what it may see is the servicer's to decide.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raydist.control.tenants import Caller, Tenants, calling_as

__all__ = ["AuthInterceptor"]

log = logging.getLogger(__name__)

_DENIED = "missing or wrong bearer token"


def _subject(context: grpc.aio.ServicerContext) -> str:
    """The subject of the caller's verified mTLS certificate, as gRPC reports it ("" if none)."""
    values = context.auth_context().get("x509_subject") or []
    return values[0].decode(errors="replace") if values else ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Admits an RPC from a known caller, made current for its handler."""

    def __init__(self, tenants: Tenants, count: Callable[[str, str], None]) -> None:
        self._tenants = tenants
        self._count = count  # (method, code): a refusal is counted as the RPC it was

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method
        if method.startswith("/grpc.health.v1.Health/"):
            return await continuation(details)
        given = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
        handler = await continuation(details)
        caller = self._tenants.by_bearer(given) if given else None
        if handler is None:
            # A method nobody serves: UNIMPLEMENTED for a known caller only;
            # a stranger learns nothing of what is served.
            if caller is not None or (not given and self._tenants.uses_subjects):
                return handler
            self._refused(method, "wrong bearer token" if given else "no bearer token")
            return _wrap(grpc.unary_unary_rpc_method_handler(lambda request, context: None), None)
        if given:
            if caller is None:
                self._refused(method, "wrong bearer token")
                return _wrap(handler, None)
            return _wrap(handler, lambda _context: caller)
        if not self._tenants.uses_subjects:
            self._refused(method, "no bearer token")
            return _wrap(handler, None)

        def by_certificate(context: grpc.aio.ServicerContext) -> Caller | None:
            caller = self._tenants.by_subject(_subject(context))
            if caller is None:
                self._refused(method, "no bearer token and no tenant's certificate")
            return caller

        return _wrap(handler, by_certificate)

    def _refused(self, method: str, why: str) -> None:
        self._count(method, "UNAUTHENTICATED")
        log.warning("refused %s: %s", method, why)


def _wrap(handler: grpc.RpcMethodHandler,
          resolve: Callable[[grpc.aio.ServicerContext], Caller | None] | None) -> grpc.RpcMethodHandler:
    """``handler`` run as the caller ``resolve`` finds (UNAUTHENTICATED when
    none, or when ``resolve`` is None), whatever its streaming kind."""

    async def admit(context: grpc.aio.ServicerContext) -> None:
        caller = resolve(context) if resolve is not None else None
        if caller is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
        calling_as(caller)  # this RPC's task: the handler and what it hands to threads

    # gRPC keeps each streaming kind's behaviour under its own name; two shapes
    # of wrapper cover them: one answer (awaited) or a stream (iterated).
    name, make = _KINDS[(handler.request_streaming, handler.response_streaming)]
    inner = getattr(handler, name)
    if handler.response_streaming:
        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await admit(context)
            async for item in inner(request, context):
                yield item

        return make(streaming, handler.request_deserializer, handler.response_serializer)

    async def answering(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await admit(context)
        return await inner(request, context)

    return make(answering, handler.request_deserializer, handler.response_serializer)


#: (request streams, response streams) -> the handler's attribute, and how gRPC makes one.
_KINDS: dict[tuple[bool, bool], tuple[str, Callable[..., grpc.RpcMethodHandler]]] = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}
