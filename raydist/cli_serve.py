"""The CLI's own control plane: ``raydist serve`` (and ``--stop``), and the
local server ``raydist up`` starts when none is configured, which stops
itself after it idles.

Presentation stays in :mod:`raydist.cli`'s consoles; this module owns the
server process: how it is started, found, waited for and stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psutil

from raydist.cli_view import err, out
from raydist.errors import ControlPlaneUnavailableError, HomeInUseError

#: How long a control plane that `raydist up` started waits without a
#: cluster before it stops itself (it holds a Spark application).
LOCAL_IDLE_STOP_S = 600


def _stop_server() -> int:
    """`raydist serve --stop`: SIGTERM the control plane of RAYDIST_HOME and
    wait until it has torn its clusters down and exited."""
    import signal

    from raydist.paths import home, home_served

    state = home()
    try:
        if not home_served(state):  # server.json may outlive its server, and its pid be another process's now
            raise ProcessLookupError
        info = json.loads((state / "server.json").read_text())
        proc = psutil.Process(int(info["pid"]))
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        out.print("no control plane is running for this RAYDIST_HOME")
        return 0
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 180
    with err.status(f"stopping the control plane (pid {proc.pid}) and its clusters..."):
        while _still_running(proc):  # a zombie has stopped: its parent reaps it, not us
            if time.monotonic() > deadline:
                err.print(f"[red]error:[/red] the control plane (pid {proc.pid}) did not stop within 180 s")
                return 1
            time.sleep(0.2)
    out.print(f"stopped the control plane that served {info.get('address')}")
    return 0


def _still_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_local_server() -> str:
    """Start `raydist serve` in the background, as `ray start` does, and wait for it."""
    from raydist.engine.ports import free_port
    from raydist.paths import home

    state = home()
    port = free_port("127.0.0.1")
    log_path = state / "server.log"
    err.print(f"[dim]no control plane running; starting one on 127.0.0.1:{port} (log: {log_path})[/dim]")
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.cli", "serve", "--port", str(port),
             "--idle-stop-s", str(LOCAL_IDLE_STOP_S)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
        )
    deadline = time.monotonic() + 180
    with err.status("starting the control plane (Spark first)..."):
        while time.monotonic() < deadline:
            exited = proc.poll()
            # Another `raydist up` may have started one at the same moment: its
            # server holds the home (ours exits with HomeInUseError's code), so
            # use that one once it serves.
            if exited is not None and exited != HomeInUseError.EXIT_CODE:
                raise ControlPlaneUnavailableError(f"the control plane exited with {exited}; see {log_path}")
            try:
                info = json.loads((state / "server.json").read_text())
                if info.get("pid") == proc.pid or (exited is not None and psutil.pid_exists(int(info["pid"]))):
                    return str(info["address"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.2)
    raise ControlPlaneUnavailableError(f"the control plane did not start within 180 s; see {log_path}")


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    if args.stop:
        return _stop_server()
    if os.environ.get("RAYDIST_TOKEN") and sys.platform.startswith("linux"):
        _serve_again_without_token(args.argv)

    from raydist.control.server import ServerConfig, serve

    cfg = ServerConfig.load(args.config).merged(
        host=args.host, port=args.port, spark_master=args.spark_master, spark_remote=args.spark_remote,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        spark_conf=dict(args.spark_conf) or None, idle_stop_s=args.idle_stop_s, head=args.head,
    )
    return asyncio.run(serve(cfg, ready=lambda addr: print(f"raydist control plane ready on {addr}", flush=True)))


def _serve_again_without_token(argv: list[str]) -> None:
    """Start this ``raydist serve`` again (``exec``: the same process) with
    ``RAYDIST_TOKEN`` handed over through a pipe instead of the environment:
    ``/proc/<pid>/environ`` shows a process's starting environment for its
    whole life, whatever it removes later. See load_or_create_server_token."""
    from raydist.control.server import TOKEN_FD_ENV

    token = os.environ.pop("RAYDIST_TOKEN")
    read, write = os.pipe()
    os.write(write, token.encode())  # a token is far below a pipe's buffer: this never blocks
    os.close(write)
    os.set_inheritable(read, True)
    env = {**os.environ, TOKEN_FD_ENV: str(read)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "raydist.cli", *argv], env)


def _say_when_local_server_stops() -> None:
    """After `down`: a control plane `raydist up` started stops by itself."""
    from raydist.paths import home

    try:
        idle = float(json.loads((home() / "server.json").read_text()).get("idle_stop_s") or 0)
    except (OSError, ValueError, TypeError):
        return
    if idle > 0:
        err.print(f"[dim]the control plane stops itself after {idle:g} s without clusters; "
                  "`raydist serve --stop` stops it now[/dim]")


