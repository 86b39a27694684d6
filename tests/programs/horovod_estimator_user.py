"""Horovod's ``examples/spark/pytorch/pytorch_spark_mnist.py``, in its shape,
on a small made-up dataset, with only raydist's alias line added:

    horovod_estimator_user.py (--master MASTER | --connect URL) WORK_DIR

A VectorAssembler's features, ``Store.create(work_dir)``, a ``SparkBackend``
as Horovod's example builds it, ``hvd.TorchEstimator(...).fit(train_df)``,
``setOutputCols``, ``transform``, an argmax UDF and Spark ML's evaluator;
then what a user checks next: the history, the run's checkpoint in the
Store, a save/load round trip, and a second fit resumed from the checkpoint.
Prints one RESULT line.
"""

import argparse
import json
import os
import sys

from raydist.compat.horovod import use_horovod_alias

use_horovod_alias()  # the one line added to Horovod's example

import horovod.spark.torch as hvd  # noqa: E402
import numpy as np  # noqa: E402
import pyspark.sql.types as T  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.optim as optim  # noqa: E402
from _session import session_args, three_classes, user_session  # noqa: E402
from horovod.spark.common.backend import SparkBackend  # noqa: E402
from horovod.spark.common.store import Store  # noqa: E402
from pyspark.ml.evaluation import MulticlassClassificationEvaluator  # noqa: E402
from pyspark.ml.feature import VectorAssembler  # noqa: E402
from pyspark.sql.functions import udf  # noqa: E402

parser = argparse.ArgumentParser()
session_args(parser)
parser.add_argument("work_dir")
args = parser.parse_args()
spark = user_session(args)

df = three_classes(spark, int)  # which of three numbers is largest
df = VectorAssembler(inputCols=["x0", "x1", "x2", "x3"], outputCol="features").transform(df).select("features", "label")
train_df, test_df = df.randomSplit([0.8, 0.2], seed=1)

store = Store.create(args.work_dir)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=-1)


torch.manual_seed(0)
model = Net()
optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
loss = nn.NLLLoss()
backend = SparkBackend(num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True)
torch_estimator = hvd.TorchEstimator(backend=backend, store=store, model=model, optimizer=optimizer,
                                     loss=lambda input, target: loss(input, target.long()),
                                     input_shapes=[[-1, 4]], feature_cols=["features"], label_cols=["label"],
                                     batch_size=16, epochs=4, validation=0.1, verbose=1, run_id="run1",
                                     random_seed=3)
torch_model = torch_estimator.fit(train_df).setOutputCols(["label_prob"])

pred_df = torch_model.transform(test_df)
argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
evaluator = MulticlassClassificationEvaluator(predictionCol="label_pred", labelCol="label", metricName="accuracy")
accuracy = evaluator.evaluate(pred_df)
columns = pred_df.columns
prob_type = type(pred_df.schema["label_prob"].dataType).__name__
predictions = [r.label_pred for r in pred_df.orderBy("features").select("label_pred").collect()]

# Save, load, predict the same.
path = os.path.join(args.work_dir, "saved-model")
torch_model.save(path)
loaded = hvd.TorchModel.load(path).setOutputCols(["label_prob"])
again = loaded.transform(test_df).withColumn("label_pred", argmax("label_prob"))
same_after_load = [r.label_pred for r in again.orderBy("features").select("label_pred").collect()] == predictions

checkpoint = os.path.join(store.get_checkpoint_path("run1"), store.get_checkpoint_filename())
checkpoint_before = os.path.exists(checkpoint)
# A second fit under the same run_id resumes from that checkpoint.
resumed = hvd.TorchEstimator(backend=SparkBackend(num_proc=2), store=store, model=Net(), optimizer=optim.SGD(
    Net().parameters(), lr=0.05), loss=lambda input, target: loss(input, target.long()), input_shapes=[[-1, 4]],
    feature_cols=["features"], label_cols=["label"], batch_size=16, epochs=1, run_id="run1",
    verbose=0).fit(train_df)
default_columns = resumed.getOutputCols()  # Horovod's name: <label>__output
resumed_history = resumed.getHistory()
resumed_accuracy = evaluator.evaluate(resumed.setOutputCols(["label_prob"]).transform(test_df)
                                      .withColumn("label_pred", argmax("label_prob")))
history = torch_model.getHistory()
spark.stop()
print("RESULT " + json.dumps({
    "accuracy": accuracy, "resumed_accuracy": resumed_accuracy, "columns": columns, "prob_type": prob_type,
    "default_columns": default_columns, "same_after_load": same_after_load, "checkpoint": checkpoint_before,
    "history": history, "resumed_history": resumed_history,
    "optimizer_lr": torch_model.getOptimizer().param_groups[0]["lr"],
    "logs": sorted(os.listdir(store.get_logs_path("run1"))),
}))
