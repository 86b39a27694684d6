"""Ray's ``ray start``, loaded before its command line is known.

``python -m raydist.engine.node.raystart`` imports Ray's command line (about a
second and a half of CPU), then reads one JSON line from stdin: the node's
command line. A supervisor starts it at once and sends the command when the
node may start (a worker waits for its head's GCS to listen), so the import
overlaps that wait instead of following it. A ``ray`` command runs here, in
the loaded interpreter; any other replaces this process (``exec``). An empty
stdin (the supervisor stopped first) ends it without starting anything.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    from ray.scripts.scripts import main as ray_main

    line = sys.stdin.readline()
    if not line.strip():
        return 0
    argv = json.loads(line)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # as the command had it: nothing to read
    os.close(null)
    if os.path.basename(argv[0]) != "ray":
        os.execvp(argv[0], argv)
    sys.argv = ["ray", *argv[1:]]
    ray_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
