"""Ray on Spark, without gRPC: one Ray cluster on one SparkSession.

The engine is four rooms over a few shared pieces, each room importing only
the ones below it (``tests/test_layers.py`` checks it):

- shared, here: ``sizing`` (pure rules: how much of a host a node may take),
  ``ports`` (free ports outside Ray's and the kernel's ranges), ``threads``,
  ``auth`` (a cluster's Ray token), ``nodelogs`` (a node's Ray logs), and this
  process's own Ray state: ``connection`` (its Ray connection) and
  ``registry`` (what it started, torn down at exit);
- ``spark/``: what the engine asks of a SparkSession, classic or Connect;
- ``link/``: the node link between the driver and each node's supervisor
  (framing, keys, the handshake, the driver's channel, the relay);
- ``node/``: one Ray node on its host (its plan and launch, the supervisor,
  ``ray start``, the reaper, the dashboard and demand processes beside it);
- ``cluster/``: the cluster itself (``RayCluster``: its handle, lifecycle,
  states and link events; the head, the worker slots and the Spark jobs that
  run them, the scaler).

Submodules are imported on use; ``raydist.engine.node.supervisor`` in
particular runs in Spark tasks and must not pull in Spark or Ray.
"""
