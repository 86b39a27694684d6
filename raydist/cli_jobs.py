"""The CLI's Ray Jobs verbs: ``raydist submit``, ``raydist jobs``, ``raydist stop``.

Each asks the control plane for the cluster's credentials (the call is on
record as an event) and then talks to the cluster's Jobs API directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from raydist.ray_jobs import RayJobs

__all__ = ["HANDLERS", "add_parsers"]


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    s = sub.add_parser("submit", help="run a script on a cluster as a Ray job: raydist submit NAME -- python x.py",
                       usage="raydist submit NAME [options] -- COMMAND [ARG ...]",
                       description="Submit a Ray job, stream its output, exit with its outcome (0: it succeeded). "
                                   "Everything after -- is the command the job runs, as written.")
    s.add_argument("name")
    s.add_argument("--working-dir", help="a directory to upload; the job runs in it")
    s.add_argument("--pip", action="append", default=[], metavar="PKG", help="a package to install for the job")
    s.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in the job's processes")
    s.add_argument("--submission-id", help="the job's id (default: Ray picks one)")
    s.add_argument("--no-wait", action="store_true", help="print the job's id and return at once")
    common(s)

    j = sub.add_parser("jobs", help="a cluster's Ray jobs")
    j.add_argument("name")
    j.add_argument("job_id", nargs="?", help="one job: its state and its output so far")
    common(j)

    k = sub.add_parser("stop", help="stop a Ray job: raydist stop NAME JOB_ID")
    k.add_argument("name")
    k.add_argument("job_id")
    common(k)


def _jobs(args: argparse.Namespace, client: Any) -> RayJobs:
    creds = client.credentials(args.name)
    jobs = RayJobs(args.name, creds.dashboard_url, creds.ray_token)
    if not args.verbose:  # Ray's SDK logs each upload and socket at INFO; -v shows them
        logging.getLogger("ray").setLevel(logging.WARNING)
    return jobs


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    from raydist.errors import SpecError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError("--env", pair, "expected KEY=VALUE")
        out[key] = value
    return out


def cmd_submit(args: argparse.Namespace, client: Any, out: Console, err: Console) -> int:
    from raydist.errors import SpecError

    entrypoint = args.entrypoint  # what followed --, set by the CLI's main
    if not entrypoint:
        raise SpecError("entrypoint", "", "give the command after --, as in: raydist submit NAME -- python train.py")
    jobs = _jobs(args, client)
    job_id = jobs.submit(entrypoint, working_dir=args.working_dir, pip=args.pip, env=_env_pairs(args.env),
                         submission_id=args.submission_id)
    if args.no_wait:
        print(job_id)
        err.print(f"[dim]follow it: raydist jobs {args.name} {job_id}; "
                  f"stop it: raydist stop {args.name} {job_id}[/dim]")
        return 0
    err.print(f"[bold]{job_id}[/bold] submitted to {args.name}; its output follows (Ctrl-C to leave or stop it)")
    try:
        info = jobs.follow(job_id, lambda chunk: (sys.stdout.write(chunk), sys.stdout.flush()),
                           on_state=lambda state, after: err.print(
                               f"[dim]job {job_id}: {state}" + (f" after {after:.1f} s" if after else "") + "[/dim]"))
    except KeyboardInterrupt:
        stop = False
        if sys.stdin.isatty():
            stop = err.input(f"\nstop job {job_id}? [y/N] ").strip().lower() in ("y", "yes")
        if stop:
            jobs.stop(job_id)
            info = jobs.wait(job_id, timeout=30)
            err.print(f"job {job_id}: {info.status}")
            return 1
        err.print(f"\njob {job_id} keeps running: raydist jobs {args.name} {job_id}; "
                  f"raydist stop {args.name} {job_id}")
        return 130
    style = "green" if info.status == "SUCCEEDED" else "red"
    err.print(f"job {job_id}: [{style}]{info.status}[/]" + (f" ({info.message})" if info.status != "SUCCEEDED" else ""))
    return 0 if info.status == "SUCCEEDED" else 1


def cmd_jobs(args: argparse.Namespace, client: Any, out: Console, err: Console) -> int:
    jobs = _jobs(args, client)
    if args.job_id:
        info = jobs.info(args.job_id)
        if args.output == "json":
            out.print_json(json.dumps({**dataclasses.asdict(info), "logs": jobs.logs(args.job_id)}))
        else:
            sys.stdout.write(jobs.logs(args.job_id))
            err.print(f"job {info.job_id}: {info.status}" + (f" ({info.message})" if info.message else ""))
        return 0
    listed = jobs.list()
    if args.output == "json":
        out.print_json(json.dumps([dataclasses.asdict(j) for j in listed]))
        return 0
    if not listed:
        out.print(f"No jobs on {args.name}. Submit one with: raydist submit {args.name} -- python script.py")
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("JOB ID", "STATUS", "STARTED", "ENTRYPOINT"):
        table.add_column(col, no_wrap=col != "ENTRYPOINT")
    for job in listed:
        started = time.strftime("%H:%M:%S", time.localtime(job.start_time)) if job.start_time else "-"
        table.add_row(job.job_id, job.status, started, job.entrypoint)
    out.print(table)
    return 0


def cmd_stop(args: argparse.Namespace, client: Any, out: Console, err: Console) -> int:
    jobs = _jobs(args, client)
    if not jobs.stop(args.job_id):
        out.print(f"job {args.job_id} had ended: {jobs.info(args.job_id).status}")
        return 0
    info = jobs.wait(args.job_id, timeout=30)
    out.print(f"job {args.job_id}: {info.status}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace, Any, Console, Console], int]] = {
    "submit": cmd_submit, "jobs": cmd_jobs, "stop": cmd_stop,
}
