"""One Ray node on its host: its plan and start (``launch``), the process
that owns it (``supervisor``, run as ``python -m
raydist.engine.node.supervisor``), Ray's ``ray start`` loaded early
(``raystart``), what keeps its processes from outliving it (``reaper``), the
dashboard and demand processes beside a head (``dashboard``, ``demand``), and
finding Ray processes on the host (``procs``).

Everything here may run in a Spark task: nothing imports Spark or Ray at
module level."""
