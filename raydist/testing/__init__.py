"""Real Spark deployments on one machine, for raydist's tests and benchmarks.

Nothing here is mocked: :mod:`raydist.testing.standalone` starts the Spark
standalone master and worker daemons that ship with pip's pyspark, optionally
each worker in its own network namespace so that Ray nodes really sit on
different hosts.
"""
