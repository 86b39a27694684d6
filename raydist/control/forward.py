"""A cluster's dashboard reached through the control plane.

The head serves Ray's dashboard on its own host, which a caller of the
control plane may not reach (a laptop outside the Spark cluster's network,
a head in an executor pod). ``ForwardDashboard`` carries one TCP connection
to it inside a gRPC stream, with the caller's token and TLS, checked as
every call is; :class:`DashboardForward` is the caller's end, a local port
whose every connection becomes one such stream (what ``raydist dashboard
NAME`` opens when the head is out of reach). Bytes pass through unread.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = ["CHUNK", "DashboardForward", "carry", "host_port", "reachable"]

log = logging.getLogger(__name__)

#: Bytes per message, each way.
CHUNK = 64 * 1024


async def carry(first: bytes, requests: AsyncIterator[Any], reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> AsyncIterator[bytes]:
    """The server's end of one forwarded connection: ``first`` and what
    the caller sends go to the dashboard (``writer``); what it answers is
    yielded, until either end closes."""

    async def up() -> None:
        try:
            if first:
                writer.write(first)
            async for message in requests:
                writer.write(message.data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # the caller closed its side: the dashboard reads the end
        except (OSError, asyncio.CancelledError):
            pass

    sending = asyncio.ensure_future(up())
    try:
        while data := await reader.read(CHUNK):
            yield data
    finally:
        sending.cancel()
        writer.close()


def host_port(url: str) -> tuple[str, int]:
    """A dashboard URL's (host, port); ValueError when it names no port."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


def reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether this host can open a TCP connection to ``url``'s host and port."""
    try:
        with socket.create_connection(host_port(url), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class DashboardForward:
    """A local port that carries each connection made to it to cluster
    ``name``'s dashboard through the control plane ``client`` reaches.
    ``url`` is where to point a browser; :meth:`close` ends it (and every
    connection through it)."""

    def __init__(self, client: Any, name: str, *, port: int = 0, host: str = "127.0.0.1") -> None:
        from raydist.engine.ports import free_port

        self._client = client
        self._name = name
        self._listener = socket.create_server((host, port or free_port(host)))
        self.url = f"http://{host}:{self._listener.getsockname()[1]}"
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"raydist-dashboard-{name}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="raydist-dashboard-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        pb = self._client._pb

        def sent() -> Iterator[Any]:  # consumed on gRPC's own thread
            yield pb.DashboardBytes(name=self._name)
            while True:
                try:
                    data = conn.recv(CHUNK)
                except OSError:
                    return
                if not data:
                    return
                yield pb.DashboardBytes(data=data)

        try:
            for reply in self._client.forward_dashboard(sent()):
                conn.sendall(reply.data)
        except Exception as exc:  # noqa: BLE001 - one connection's end, never the forward's
            log.warning("a connection to %s's dashboard ended: %s", self._name, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            _end(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        self._listener.close()
        for conn in conns:
            _end(conn)


    def __enter__(self) -> DashboardForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(conn: socket.socket) -> None:
    """Close ``conn``, waking a thread blocked reading it (a close alone does not)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
