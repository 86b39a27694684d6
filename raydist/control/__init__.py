"""The gRPC control plane: server (``raydist serve``), durable store, client.

``raydist.control.Client`` is the typed, synchronous client the CLI and the
Python API use; import the server only where one runs.
"""

from __future__ import annotations

import os
from typing import Any

# gRPC's fork handlers crash a child forked while gRPC threads run (SIGSEGV
# or SIGABRT before exec: about one fork in ten under load, measured). The
# control plane forks while it serves (Spark's gateway JVM, a head's
# `ray start`), and clients fork too (a SparkSession). Each child here execs
# at once and needs none of gRPC, so the handlers stay off. gRPC reads the
# setting when it is first imported, which every gRPC import in raydist
# follows, since all of them live in this package.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__all__ = ["Client"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from raydist.control.client import Client

        return Client
    raise AttributeError(name)
