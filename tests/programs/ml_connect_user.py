"""A Spark ML program written against ``pyspark.ml.connect`` as its docs
write one: a Pipeline (StandardScaler, then LogisticRegression on two
training workers), its predictions, a save/load round trip, then a
CrossValidator over two learning rates with two folds fitted in parallel.

    ml_connect_user.py (--connect URL | --master MASTER) [--original]

``--original`` imports ``pyspark.ml.connect`` itself; otherwise the only
change is the import prefix, ``raydist.compat.ml.connect``. Prints one RESULT
line: the fitted weights, the transformed columns and predictions, whether
the loaded model predicts the same, the CV metrics, and (raydist) how many
Ray Train worker processes the fits ran in.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time

parser = argparse.ArgumentParser()
where = parser.add_mutually_exclusive_group(required=True)
where.add_argument("--connect")
where.add_argument("--master")
parser.add_argument("--original", action="store_true")
opts = parser.parse_args()

from pyspark.sql import SparkSession  # noqa: E402

if opts.original:
    from pyspark.ml.connect.classification import LogisticRegression
    from pyspark.ml.connect.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.connect.feature import StandardScaler
    from pyspark.ml.connect.pipeline import Pipeline, PipelineModel
    from pyspark.ml.connect.tuning import CrossValidator
else:
    from raydist.compat.ml.connect.classification import LogisticRegression
    from raydist.compat.ml.connect.evaluation import BinaryClassificationEvaluator
    from raydist.compat.ml.connect.feature import StandardScaler
    from raydist.compat.ml.connect.pipeline import Pipeline, PipelineModel
    from raydist.compat.ml.connect.tuning import CrossValidator
from pyspark.ml.tuning import ParamGridBuilder  # noqa: E402

if opts.connect:
    spark = SparkSession.builder.remote(opts.connect).getOrCreate()
else:
    spark = (SparkSession.builder.master(opts.master).config("spark.executor.memory", "1g")
             .config("spark.ui.enabled", "false").getOrCreate())

rng = random.Random(7)
rows = []
for _ in range(64):
    x0, x1 = rng.uniform(-3, 3), rng.uniform(-3, 3)
    rows.append((1 if x0 + 0.5 * x1 > 0 else 0, [x0, x1]))
# One input partition: LogisticRegression deals the rows round-robin to its
# training partitions, and from several map outputs each partition's row
# order would follow the order shuffle blocks arrive in, so that pyspark's
# own weights would move between runs.
train = spark.createDataFrame(rows, ["label", "features"]).coalesce(1)
test = spark.createDataFrame([(1, [2.0, 1.0]), (0, [-2.0, -1.0]), (1, [0.5, 0.2])], ["label", "features"])

t0 = time.monotonic()
lr = LogisticRegression(featuresCol="scaled", numTrainWorkers=2, maxIter=5, learningRate=0.1, seed=3)
pipeline = Pipeline(stages=[StandardScaler(inputCol="features", outputCol="scaled"), lr])
model = pipeline.fit(train)
fit_s = time.monotonic() - t0
out = model.transform(test).toPandas()
lor = model.stages[-1]
weights = {k: v.tolist() for k, v in lor.torch_model.state_dict().items()}

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model")
    model.saveToLocal(path)
    try:
        loaded = PipelineModel.loadFromLocal(path)
        same_after_load = loaded.transform(test).toPandas()["prediction"].tolist() == out["prediction"].tolist()
    except Exception as e:  # noqa: BLE001 - what the user sees is the result
        same_after_load = f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
    est_path = os.path.join(tmp, "estimator")
    lr.saveToLocal(est_path)
    lr_loaded = type(lr).loadFromLocal(est_path)
    estimator_round_trip = (type(lr_loaded).__module__, lr_loaded.getNumTrainWorkers(), lr_loaded.getLearningRate())

t0 = time.monotonic()
grid = ParamGridBuilder().addGrid(lr.learningRate, [0.05, 0.2]).build()
cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=BinaryClassificationEvaluator(),
                    numFolds=2, parallelism=2, seed=11)
cv_model = cv.fit(train)
cv_s = time.monotonic() - t0

spark.stop()
print("RESULT " + json.dumps({
    "weights": weights,
    "columns": list(out.columns),
    "predictions": out["prediction"].tolist(),
    "probability": [list(map(float, p)) for p in out["probability"]],
    "same_after_load": same_after_load,
    "estimator_round_trip": list(estimator_round_trip),
    "cv_metrics": [float(m) for m in cv_model.avgMetrics],
    "fit_s": round(fit_s, 1), "cv_s": round(cv_s, 1),
}))
sys.stdout.flush()
