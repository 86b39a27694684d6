"""[Experimental] Spark ML on raydist: see :mod:`raydist.compat.ml.connect`."""
