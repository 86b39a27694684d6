"""A rank in a fresh interpreter: ``python -m raydist.train._fresh_rank FD PICKLER``.

For a parent that cannot be forked safely (:func:`raydist.train._fork.fork_unsafe`:
a Spark Python worker that ran TensorFlow for the user's own Spark work).
Reads the pickled job from stdin, runs it as a forked child would, and
writes its outcome to file descriptor FD (:func:`raydist.train._fork.run_child`).
"""

from __future__ import annotations

import importlib
import os
import sys


def main(argv: list[str]) -> int:
    write_fd, pickler = int(argv[1]), argv[2]
    cloudpickle = importlib.import_module(pickler)
    payload = sys.stdin.buffer.read()
    from raydist.train._fork import run_child

    known = set(sys.modules)
    run_child(lambda: cloudpickle.loads(payload)(), {}, cloudpickle, write_fd, known)
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main(sys.argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter teardown, as a forked child
