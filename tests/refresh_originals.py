"""Record what pyspark's own distributors give the programs the suite compares
raydist with, so the suite reads them instead of running the originals
every time (``make refresh-originals``; tests/test_gpu_layouts.py checks the
file was made by the installed pyspark).

    python -m tests.refresh_originals
"""

from __future__ import annotations

import json
import sys

import pyspark

from tests.probe import ORIGINALS, run_original

#: Programs and their arguments whose --original results are recorded.
RECORDED = {"gpu_layouts.py": ("two-executors", "one-executor-four-gpus", "two-gpus-a-task",
                               "executor-visible-devices")}


def main() -> int:
    results: dict[str, dict[str, dict]] = {}
    for program, layouts in RECORDED.items():
        for layout in layouts:
            print(f"{program} {layout} --original ...", flush=True)
            got = run_original(program, layout, timeout=600)
            got.pop("_output", None)
            results.setdefault(program, {})[layout] = got
    data = {"pyspark": pyspark.__version__, "command": "make refresh-originals", "results": results}
    ORIGINALS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ORIGINALS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
