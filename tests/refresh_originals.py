"""Record what pyspark's own distributors (and spark-tensorflow-distributor,
DeepSpeed) give the programs the suite compares raydist with, so the suite
reads them instead of running the originals every time
(``make refresh-originals``; tests/test_originals.py checks the file was made
by the installed pyspark and holds every program the suite reads).

    python -m tests.refresh_originals [PROGRAM ...]

With program names, only those are run again; the others keep their record.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pyspark

from tests.probe import CONNECT_URL, ORIGINALS, run_original

#: Programs and the argument lists whose --original results are recorded
#: (CONNECT_URL: the program is a client of a Spark Connect server started here).
RECORDED: dict[str, tuple[tuple[str, ...], ...]] = {
    "gpu_layouts.py": (("two-executors",), ("one-executor-four-gpus",), ("two-gpus-a-task",),
                       ("executor-visible-devices",)),
    "notebook_life.py": ((),),
    "connect_surface.py": ((CONNECT_URL,),),
    "ml_connect_user.py": (("--master", "local-cluster[2,1,1024]"), ("--connect", CONNECT_URL)),
}


def _record(program: str, args: tuple[str, ...], connect_url: str | None) -> dict:
    print(f"{program} {' '.join(args)} --original ...", flush=True)
    real = [connect_url if a == CONNECT_URL else a for a in args]
    with tempfile.TemporaryDirectory(prefix="raydist-originals-") as home:
        got = run_original(program, *real, home=Path(home), timeout=900)
    got.pop("_output", None)
    return got


def main(argv: list[str]) -> int:
    wanted = argv or list(RECORDED)
    unknown = sorted(set(wanted) - set(RECORDED))
    if unknown:
        print(f"not a recorded program: {', '.join(unknown)} (choose from {', '.join(RECORDED)})", file=sys.stderr)
        return 2
    old = json.loads(ORIGINALS.read_text()) if ORIGINALS.exists() else {}
    keep = old.get("results", {}) if old.get("pyspark") == pyspark.__version__ else {}
    results = {p: r for p, r in keep.items() if p in RECORDED and p not in wanted}
    connect = None
    try:
        for program in wanted:
            for args in RECORDED[program]:
                if CONNECT_URL in args and connect is None:
                    from raydist.testing.connect import ConnectServer

                    # The suite's Connect server's shape (tests/conftest.py).
                    connect = ConnectServer(master="local-cluster[3,1,1024]").start()
                got = _record(program, args, connect.url if connect else None)
                results.setdefault(program, {})[" ".join(args)] = got
    finally:
        if connect is not None:
            connect.stop()
    missing = sorted(set(RECORDED) - set(results))
    if missing:
        print(f"not recorded for pyspark {pyspark.__version__}: {', '.join(missing)}; run with no arguments",
              file=sys.stderr)
    data = {"pyspark": pyspark.__version__, "command": "make refresh-originals", "results": results}
    ORIGINALS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ORIGINALS}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
