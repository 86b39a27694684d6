"""The ``raydist`` command. It talks only to the control-plane client, and it
owns presentation: progress, tables, JSON with ``-o json``.

Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from raydist import __version__, cli_dashboard, cli_jobs
from raydist.cli_serve import (
    _say_when_local_server_stops,
    _start_local_server,
    cmd_serve,
)
from raydist.cli_view import as_dict, clusters_table, err, nodes_table, out
from raydist.errors import ControlPlaneUnavailableError, HomeInUseError, RaydistError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2 with the usage line
        self.print_usage(sys.stderr)
        err.print(f"[red]error:[/red] {message}")
        raise SystemExit(2)


def _conf_pair(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raydist", description="Ray clusters inside Spark executors.")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-o", "--output", choices=("table", "json"), default="table")
        sp.add_argument("--address", help="control plane host:port (default RAYDIST_ADDRESS or the local one)")
        sp.add_argument("--tls-ca", help="CA of a TLS control plane (default RAYDIST_TLS_CA)")
        sp.add_argument("--tls-cert", help="client certificate for mTLS (default RAYDIST_TLS_CERT)")
        sp.add_argument("--tls-key", help="client key for mTLS (default RAYDIST_TLS_KEY)")

    s = sub.add_parser("serve", help="run the control plane")
    s.add_argument("--config", help="a raydist.toml (default RAYDIST_CONFIG); flags win over it")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="gRPC port (default 50151)")
    s.add_argument("--spark-master", default=os.environ.get("RAYDIST_SPARK_MASTER"))
    s.add_argument("--spark-remote", metavar="sc://HOST:PORT",
                   help="a Spark reached through Spark Connect, instead of --spark-master")
    s.add_argument("--spark-conf", action="append", type=_conf_pair, default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the server's SparkSession (repeatable)")
    s.add_argument("--tls-cert")
    s.add_argument("--tls-key")
    s.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mTLS)")
    s.add_argument("--metrics-port", type=int, help="Prometheus port (0 picks one, -1 turns it off)")
    s.add_argument("--metrics-host", help="where the metrics listen (default 127.0.0.1: they are not authenticated)")
    s.add_argument("--idle-stop-s", type=float, help="stop after this many seconds without a cluster (0: never)")
    s.add_argument("--stop", action="store_true", help="stop the control plane serving RAYDIST_HOME, then exit")
    s.add_argument("--head", choices=("auto", "executor", "driver"),
                   help="where each cluster's head runs: a Spark task of its own (executor: tenants stay out "
                        "of the control plane's processes) or beside the control plane (driver); auto "
                        "(default): executor unless the master is local")

    u = sub.add_parser("up", help="create a cluster and wait until it is ready")
    u.add_argument("name")
    u.add_argument("-w", "--workers", type=int)
    u.add_argument("--min-workers", type=int)
    u.add_argument("--max-workers", type=int)
    u.add_argument("--idle-timeout", type=float, help="an elastic cluster removes a node idle this long (s, 60)")
    u.add_argument("--cpus-per-worker", type=int)
    u.add_argument("--gpus-per-worker", type=float, default=0.0)
    u.add_argument("--memory-per-worker")
    u.add_argument("--restart", action="store_true", help="start it again when the control plane restarts")
    u.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=True,
                   help="run the Ray dashboard on the head: it serves Ray Jobs (raydist submit); "
                        "--no-dashboard starts about 2 s sooner on a small host")
    u.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True)
    u.add_argument("--timeout", type=float, default=600.0)
    common(u)

    d = sub.add_parser("down", help="tear a cluster down")
    d.add_argument("name", nargs="?")
    d.add_argument("--all", action="store_true")
    d.add_argument("-y", "--yes", action="store_true", help="do not ask before --all")
    common(d)

    st = sub.add_parser("status", help="one cluster, or all")
    st.add_argument("name", nargs="?")
    common(st)
    ls = sub.add_parser("list", help="all clusters")
    common(ls)
    lg = sub.add_parser("logs", help="a cluster's events, or a node's Ray logs (--node)")
    lg.add_argument("name")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing what comes")
    lg.add_argument("--node", help="a node's Ray logs: its # as `raydist status NAME` lists it, its key (head, "
                                   "w0...) or a prefix of its Ray node id")
    lg.add_argument("--file", default="", help="with --node: one file (default: each, newest first; "
                                               "-f follows raylet.out)")
    lg.add_argument("--run", default="", help="the nodes' logs a teardown kept: 'last' or a kept run's name "
                                              "(every node's, or --node's)")
    lg.add_argument("--grep", default="", help="with --node or --run: only the lines containing this text")
    common(lg)
    sc = sub.add_parser("scale", help="resize a running cluster: raydist scale NAME N (or --min/--max)")
    sc.add_argument("name")
    sc.add_argument("workers", type=int, nargs="?")
    sc.add_argument("--min", dest="min_workers", type=int)
    sc.add_argument("--max", dest="max_workers", type=int)
    sc.add_argument("--idle-timeout", type=float)
    common(sc)
    en = sub.add_parser("env", help="shell exports that connect Ray to a cluster: eval \"$(raydist env NAME)\"")
    en.add_argument("name")
    en.add_argument("--gcs", action="store_true",
                    help="RAY_ADDRESS is the GCS address (a driver on the cluster's network) instead of "
                         "the Ray Client (ray://) address")
    common(en)
    cli_jobs.add_parsers(sub, common)
    cli_dashboard.add_parsers(sub, common)
    sub.add_parser("version", help="print the version")
    return p


# --- helpers -----------------------------------------------------------------


def _client(args: argparse.Namespace, start_local: bool = False) -> Any:
    from raydist.control.client import Client, default_address

    address = args.address or default_address()
    if address:
        client = Client(address, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key)
        try:
            client.server_info(timeout=5)
            return client
        except ControlPlaneUnavailableError:
            if not start_local or args.address or os.environ.get("RAYDIST_ADDRESS"):
                raise
    elif not start_local:
        raise ControlPlaneUnavailableError("no control plane: run `raydist serve` or set RAYDIST_ADDRESS")
    return Client(_start_local_server())


@contextlib.contextmanager
def _ticking(tick: Callable[[], None], every_s: float = 0.5) -> Iterator[None]:
    """Call ``tick`` every ``every_s`` seconds in a thread while the block runs
    (a progress line's elapsed time moves between the events it shows)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            tick()

    thread = threading.Thread(target=run, daemon=True, name="raydist-cli-tick")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- commands ----------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from raydist._proto import pb
    from raydist.spec import ClusterSpec

    spec = ClusterSpec(
        name=args.name, workers=args.workers, min_workers=args.min_workers, max_workers=args.max_workers,
        cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
        memory_per_worker=args.memory_per_worker, dashboard=args.dashboard,
        **({"idle_timeout_s": args.idle_timeout} if args.idle_timeout is not None else {}),
    )
    client = _client(args, start_local=True)
    t0 = time.monotonic()
    cluster = client.create(spec, request_id=uuid.uuid4().hex, restart_on_server_restart=args.restart)
    if args.wait:
        line = [f"{spec.name}: creating"]

        def show() -> None:
            status.update(f"{line[0]} ({time.monotonic() - t0:.0f} s)")

        with err.status(line[0]) as status, _ticking(show):
            for event in client.watch(spec.name, timeout=args.timeout):
                c = event.cluster
                line[0] = (f"{spec.name}: {pb.State.Name(event.state)}, workers ready "
                           f"{c.ready_workers}/{c.desired_workers}, {event.message}")
                cluster = c
                if event.state in (pb.RUNNING, pb.DEGRADED, pb.FAILED, pb.DELETED):
                    break
        cluster = client.get(spec.name)
    if args.output == "json":
        out.print_json(json.dumps(as_dict(cluster)))
    else:
        state = pb.State.Name(cluster.state)
        if cluster.state == pb.FAILED:
            err.print(f"[red]{spec.name} FAILED:[/red] {cluster.message}")
            return 1
        took = f" after {time.monotonic() - t0:.0f} s" if args.wait else ""
        out.print(f"[bold]{spec.name}[/bold] is {state} with {cluster.ready_workers}/{cluster.desired_workers} "
                  f"workers{took}")
        if cluster.client_address:
            out.print(f"  Ray Client:  {cluster.client_address}")
            out.print(f"  GCS address: {cluster.address}")
            if cluster.dashboard_url:
                out.print(f"  Dashboard:   {cluster.dashboard_url}")
        out.print("Next:")
        out.print(f"  raydist status {spec.name}")
        if cluster.dashboard_url:
            out.print(f"  raydist submit {spec.name} -- python train.py   # a Ray job, its output streamed here")
        out.print(f"  eval \"$(raydist env {spec.name})\"   # RAY_ADDRESS and the cluster's Ray token")
        out.print("  python -c 'import ray; ray.init()'")
        out.print(f"  raydist down {spec.name}")
    return 1 if cluster.state == pb.FAILED else 0


def cmd_down(args: argparse.Namespace) -> int:
    from raydist._proto import pb

    if bool(args.name) == bool(args.all):
        err.print("[red]error:[/red] give a cluster NAME or --all")
        return 2
    client = _client(args)
    names = [args.name] if args.name else [c.spec.name for c in client.list() if c.state not in (pb.DELETED,)]
    if args.all and not args.yes:
        if not sys.stdin.isatty():
            err.print("[red]error:[/red] --all needs -y when not run interactively")
            return 2
        if input(f"Tear down {len(names)} clusters ({', '.join(names)})? [y/N] ").strip().lower() != "y":
            return 1
    results = []
    for name in names:
        with err.status(f"tearing down {name}..."):
            results.append(client.delete(name))
    if args.output == "json":
        out.print_json(json.dumps([as_dict(c) for c in results]))
    else:
        for c in results:
            out.print(f"{c.spec.name}: {pb.State.Name(c.state)}")
        _say_when_local_server_stops()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    clusters = [client.get(args.name)] if getattr(args, "name", None) else client.list()
    if args.output == "json":
        payload: Any = as_dict(clusters[0]) if getattr(args, "name", None) else [as_dict(c) for c in clusters]
        out.print_json(json.dumps(payload))
    else:
        clusters_table(out, clusters)
        if getattr(args, "name", None):
            nodes_table(out, clusters[0])
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    if args.workers is None and args.min_workers is None and args.max_workers is None and args.idle_timeout is None:
        err.print("[red]error:[/red] give a worker count (raydist scale NAME N) or --min/--max/--idle-timeout")
        return 2
    cluster = _client(args).update(args.name, workers=args.workers, min_workers=args.min_workers,
                                   max_workers=args.max_workers, idle_timeout_s=args.idle_timeout)
    spec = cluster.spec
    size = (f"{spec.min_workers}..{spec.max_workers} workers (elastic, idle timeout {spec.idle_timeout_s:g} s)"
            if spec.min_workers < spec.max_workers else f"{spec.max_workers} workers")
    out.print(f"[bold]{args.name}[/bold]: {size}; {cluster.ready_workers}/{cluster.desired_workers} up now")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """The one command whose output holds a secret, because that is what it
    is for; it says so on stderr when a person is looking."""
    import shlex

    creds = _client(args).credentials(args.name)
    address = creds.address if args.gcs else creds.client_address
    print(f"export RAY_ADDRESS={shlex.quote(address)}")
    print("export RAY_AUTH_MODE=token")
    print(f"export RAY_AUTH_TOKEN={shlex.quote(creds.ray_token)}")
    if sys.stdout.isatty():
        err.print(f"[dim]these lines hold {args.name}'s Ray token: use them as "
                  f"eval \"$(raydist env {args.name})\"[/dim]")
    return 0


def _node_logs(args: argparse.Namespace) -> int:
    """A node's Ray log files through its supervisor; -f follows one file."""
    from raydist.engine.nodelogs import grep_lines

    client = _client(args)
    file = args.file or ("raylet.out" if args.follow else "")
    # Following, the offsets count the file's bytes: the lines are filtered here, not by the server.
    logs = client.node_logs(args.name, args.node, file=file, grep="" if args.follow else args.grep)
    if args.output == "json":
        out.print_json(json.dumps({"node": logs.node, "files": [
            {"name": f.name, "size": f.size, "offset": f.offset, "text": f.data.decode("utf-8", "replace")}
            for f in logs.files]}))
        return 0
    for f in logs.files:
        if not args.follow:
            part = f", the last {len(f.data)}" if f.offset else ""
            err.print(f"[bold]==> {logs.node}/{f.name} ({f.size} bytes{part}) <==[/bold]")
        sys.stdout.write(grep_lines(f.data, args.grep).decode("utf-8", "replace"))
        sys.stdout.flush()
    if not args.follow:
        return 0
    if not logs.files:
        err.print(f"[red]error:[/red] node {logs.node} has no log file {file!r}")
        return 1
    offset = logs.files[0].offset + len(logs.files[0].data)
    while True:
        time.sleep(1.0)
        more = client.node_logs(args.name, args.node, file=file, offset=offset).files
        for f in more:
            if f.data:
                sys.stdout.write(grep_lines(f.data, args.grep).decode("utf-8", "replace"))
                sys.stdout.flush()
                offset = f.offset + len(f.data)


def _kept_logs(args: argparse.Namespace) -> int:
    """What a teardown kept of a cluster's nodes' logs (--run)."""
    if args.follow:
        err.print("[red]error:[/red] -f follows a running node's log; a kept run's logs do not grow: leave out -f")
        return 2
    logs = _client(args).node_logs(args.name, args.node or "", run=args.run, grep=args.grep)
    if args.output == "json":
        out.print_json(json.dumps({"run": args.run, "files": [
            {"name": f.name, "size": f.size, "text": f.data.decode("utf-8", "replace")} for f in logs.files]}))
        return 0
    for f in logs.files:
        err.print(f"[bold]==> {f.name} ({f.size} bytes{', matching lines' if args.grep else ''}) <==[/bold]")
        sys.stdout.write(f.data.decode("utf-8", "replace"))
        sys.stdout.flush()
    if not logs.files:
        err.print(f"no line contains {args.grep!r}" if args.grep else "the run kept no files")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from raydist._proto import pb

    if args.run:
        return _kept_logs(args)
    if args.node:
        return _node_logs(args)
    client = _client(args)
    for event in client.watch(args.name, timeout=None if args.follow else 2.0, history=True):
        when = time.strftime("%H:%M:%S", time.localtime(event.time.seconds))
        if args.output == "json":
            out.print_json(json.dumps({"time": event.time.ToJsonString(), "state": pb.State.Name(event.state),
                                       "message": event.message}))
        else:
            # One line an event, never folded at the console's width (a kept
            # run's path is longer than a terminal): a line to grep, as `ray logs`'.
            out.print(f"{when} {pb.State.Name(event.state):9} {event.message}", soft_wrap=True, markup=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    given = list(argv)
    # `raydist submit NAME [options] -- COMMAND...`: what follows the first --
    # is the job's command, word for word (argparse would read its options).
    entrypoint: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, entrypoint = argv[:cut], argv[cut + 1:]
    parser = _parser()
    args = parser.parse_args(argv)
    if entrypoint and args.command != "submit":
        parser.error(f"only `raydist submit` takes a command after --, not `raydist {args.command}`")
    args.entrypoint = entrypoint
    args.argv = given
    logging.basicConfig(level=logging.INFO if args.verbose or args.command == "serve" else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.command == "version":
        print(f"raydist {__version__}")
        return 0
    handlers = {"serve": cmd_serve, "up": cmd_up, "down": cmd_down, "status": cmd_status, "list": cmd_status,
                "logs": cmd_logs, "env": cmd_env, "scale": cmd_scale}
    try:
        for verbs in (cli_jobs.HANDLERS, cli_dashboard.HANDLERS):
            if args.command in verbs:
                return verbs[args.command](args, _client(args), out, err)
        return handlers[args.command](args)
    except RaydistError as exc:
        from raydist.errors import SpecError

        err.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line per line: paths stay whole
        if isinstance(exc, HomeInUseError):
            return HomeInUseError.EXIT_CODE
        return 2 if isinstance(exc, SpecError) else 1
    except KeyboardInterrupt:
        err.print("interrupted; the control plane keeps going: check with `raydist status`")
        return 1


if __name__ == "__main__":
    sys.exit(main())
