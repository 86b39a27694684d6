"""The gRPC control plane: server (``raydist serve``), durable store, client.

``raydist.control.Client`` is the typed, synchronous client the CLI and the
Python API use; import the server only where one runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Client"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from raydist.control.client import Client

        return Client
    raise AttributeError(name)
