"""How the suite's JVMs run (tests/README.md, "JVMs tuned for short lives").

Each JVM the suite starts lives seconds to minutes and runs tiny jobs on a
machine whose cores are the bottleneck: C2's compiler threads and the
parallel GC's threads are CPU the tests never get back. C1 only and the
serial GC change how Spark's bytecode is compiled and collected, nothing it
does. ``benchmarks/suite_jvm.py`` measures the difference.
"""

from __future__ import annotations

#: Added to JAVA_TOOL_OPTIONS for every process the suite starts.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def with_short_lived_jvms(current: str | None) -> str:
    """``JAVA_TOOL_OPTIONS`` with the suite's options after what was there."""
    return " ".join(filter(None, (current, SHORT_LIVED_JVM_OPTIONS)))
