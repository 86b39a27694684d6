"""Ray on Spark, without gRPC: sizing, the node supervisor, the cluster launcher.

Submodules are imported on use; ``raydist.engine.supervisor`` in particular
runs in Spark tasks and must not pull in Spark or Ray.
"""
