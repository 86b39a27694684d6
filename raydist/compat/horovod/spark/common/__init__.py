"""[Experimental] ``horovod.spark.common``: the Store and the Backend that
Horovod's Spark estimators take (:mod:`.store`, :mod:`.backend`)."""
