"""[Experimental] ``pyspark.ml.connect``, training on raydist.

The same module layout as ``pyspark.ml.connect`` (``classification``,
``feature``, ``evaluation``, ``pipeline``, ``tuning``, ``functions``), so a
program changes only its import prefix::

    from raydist.compat.ml.connect.classification import LogisticRegression
    from raydist.compat.ml.connect.pipeline import Pipeline

What trains through a distributor (``classification.LogisticRegression``)
trains through raydist's ``TorchDistributor``: in Spark's tasks at first,
as pyspark's does, then on the session cluster, which warms up once fits
pause and stays warm between them (a sweep, each fold of a ``CrossValidator``). Every
other class here *is* pyspark's own (the scalers, ``ArrayAssembler``, the
evaluators, ``Pipeline``, ``CrossValidator``, the functions): they need no
distributor, and they take raydist's estimator as they take pyspark's. The
models a fit returns are pyspark's models, so ``transform``, ``save`` and
``load`` are pyspark's too, and a model saved from either loads in both.
"""

from pyspark.ml.connect import Estimator, Evaluator, Model, Transformer

from raydist.compat.ml.connect import classification, evaluation, feature, functions, pipeline, tuning
from raydist.compat.ml.connect.pipeline import Pipeline, PipelineModel

__all__ = ["Estimator", "Transformer", "Evaluator", "Model", "classification", "feature", "evaluation",
           "functions", "pipeline", "Pipeline", "PipelineModel", "tuning"]
