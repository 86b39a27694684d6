"""raydist: Ray clusters inside Spark executors.

``raydist.up(...)`` starts a Ray cluster on a SparkSession and returns its
handle; ``raydist.down(name)`` tears one down; ``raydist.attach(name)`` is a
handle to a cluster a control plane (``raydist serve``) runs. Training facades live in
``raydist.train``, Spark-distributor-shaped classes in ``raydist.compat``.
Importing ``raydist`` stays light: Spark, Ray and the frameworks load on use.
"""

from raydist.api import attach, clusters, down, spark_log, up
from raydist.errors import RaydistError
from raydist.spec import ClusterSpec, ClusterStatus, State

__version__ = "0.1.0"

__all__ = ["up", "down", "attach", "clusters", "spark_log", "ClusterSpec", "ClusterStatus", "State", "RaydistError",
           "__version__"]
