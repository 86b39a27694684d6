"""The CLI's ``raydist dashboard NAME``: Ray's dashboard on demand.

A cluster runs without Ray's dashboard unless made with it; this starts it
on the running cluster (``--stop`` stops it again) and prints where to open
it. When the head is out of this host's reach, it forwards a local port to
the dashboard through the control plane and holds it open until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable
from typing import Any

from rich.console import Console

__all__ = ["HANDLERS", "add_parsers"]


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    d = sub.add_parser("dashboard", help="start Ray's dashboard on a running cluster and print where to open it",
                       description="Start Ray's dashboard on a running cluster that has none (it also serves Ray "
                                   "Jobs from then on) and print its URL. When the head cannot be reached from "
                                   "here, a local port is forwarded to it through the control plane until Ctrl-C.")
    d.add_argument("name")
    d.add_argument("--stop", action="store_true", help="stop a dashboard started this way")
    d.add_argument("--forward", action=argparse.BooleanOptionalAction, default=None,
                   help="forward a local port to it through the control plane (default: only when the head "
                        "cannot be reached from here)")
    d.add_argument("--port", type=int, default=0, help="the local port to forward (default: a free one)")
    common(d)


def cmd_dashboard(args: argparse.Namespace, client: Any, out: Console, err: Console) -> int:
    from raydist.control.forward import DashboardForward, reachable

    found = client.set_dashboard(args.name, stop=args.stop)
    if args.stop:
        out.print(f"Ray's dashboard of {args.name} stopped.")
        return 0
    forward = args.forward if args.forward is not None else not reachable(found.url)
    if not forward:
        if args.output == "json":
            out.print_json(json.dumps({"name": args.name, "url": found.url}))
            return 0
        out.print(f"Dashboard of {args.name}: {found.url}", soft_wrap=True)
        out.print(f"It runs until the cluster goes down; `raydist dashboard {args.name} --stop` stops it now.")
        return 0
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with DashboardForward(client, args.name, port=args.port) as local:
        if args.output == "json":
            out.print_json(json.dumps({"name": args.name, "url": local.url, "head": found.url}))
        else:
            out.print(f"Dashboard of {args.name}: {local.url} (forwarded to {found.url} through the control "
                      "plane; Ctrl-C ends the forward)", soft_wrap=True)
            out.print(f"It runs until the cluster goes down; `raydist dashboard {args.name} --stop` stops it now.")
        out.file.flush()
        done.wait()
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace, Any, Console, Console], int]] = {"dashboard": cmd_dashboard}
