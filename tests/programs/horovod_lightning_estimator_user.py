"""Horovod's ``examples/spark/pytorch/pytorch_lightning_spark_mnist.py``, in
its shape, on a small made-up dataset, with only raydist's alias line added:

    horovod_lightning_estimator_user.py (--master MASTER | --connect URL) WORK_DIR

A ``LightningModule`` whose ``training_step`` reads Horovod's dict batches,
a callback counting epochs, ``hvd.TorchEstimator(...).fit(train_df)``,
``setOutputCols``, ``transform``, an argmax UDF and Spark ML's evaluator;
then the history, the run's checkpoint in the Store, save/load, and a second
fit under the same run_id resuming from the checkpoint. Prints one RESULT line.
"""

import argparse
import json
import os

from raydist.compat.horovod import use_horovod_alias

use_horovod_alias()  # the one line added to Horovod's example

import horovod.spark.lightning as hvd  # noqa: E402
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
from pytorch_lightning import Callback, LightningModule  # noqa: E402

parser = argparse.ArgumentParser()
session_args(parser)
parser.add_argument("work_dir")
args = parser.parse_args()
spark = user_session(args)

df = three_classes(spark)  # which of three numbers is largest
df = VectorAssembler(inputCols=["x0", "x1", "x2", "x3"], outputCol="features").transform(df).select("features", "label")
train_df, test_df = df.randomSplit([0.8, 0.2], seed=1)

store = Store.create(args.work_dir)


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.float()))), -1)

    def configure_optimizers(self):
        return optim.SGD(self.parameters(), lr=0.2, momentum=0.5)

    def training_step(self, batch, batch_idx):
        x, y = batch["features"], batch["label"]
        loss = F.nll_loss(self(x), y.long())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch["features"], batch["label"]
        self.log("val_loss", F.nll_loss(self(x), y.long()), sync_dist=True)


class EpochCounter(Callback):
    """Counts the epochs a fit trains; rank 0 also notes the count in
    ``path`` (the ranks run elsewhere: the program reads it back)."""

    def __init__(self, path):
        self.train_epochs = 0
        self.path = path

    def on_train_epoch_end(self, trainer, model):
        self.train_epochs += 1

    def on_train_end(self, trainer, model):
        print(f"Training ends: train_epochs={self.train_epochs}", flush=True)
        if trainer.global_rank == 0:
            with open(self.path, "a") as f:
                f.write(f"{self.train_epochs}\n")


os.makedirs(args.work_dir, exist_ok=True)
epochs_seen = os.path.join(args.work_dir, "train_epochs")


torch.manual_seed(0)
backend = SparkBackend(num_proc=2)
torch_estimator = hvd.TorchEstimator(backend=backend, store=store, model=Net(), input_shapes=[[-1, 4]],
                                     feature_cols=["features"], label_cols=["label"], batch_size=16, epochs=4,
                                     validation=0.1, verbose=0, callbacks=[EpochCounter(epochs_seen)], run_id="run1",
                                     random_seed=3)
torch_model = torch_estimator.fit(train_df).setOutputCols(["label_prob"])

pred_df = torch_model.transform(test_df)
argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
evaluator = MulticlassClassificationEvaluator(predictionCol="label_pred", labelCol="label", metricName="accuracy")
accuracy = evaluator.evaluate(pred_df)
columns = pred_df.columns
predictions = [r.label_pred for r in pred_df.orderBy("features").select("label_pred").collect()]

path = os.path.join(args.work_dir, "saved-model")
torch_model.save(path)
loaded = hvd.TorchModel.load(path).setOutputCols(["label_prob"])
again = loaded.transform(test_df).withColumn("label_pred", argmax("label_prob"))
same_after_load = [r.label_pred for r in again.orderBy("features").select("label_pred").collect()] == predictions

checkpoint = sorted(f for f in os.listdir(store.get_checkpoint_path("run1")) if f.startswith("checkpoint"))
# The same run_id again, two more epochs: it resumes from the checkpoint (Lightning counts epochs on).
resumed = hvd.TorchEstimator(backend=SparkBackend(num_proc=2), store=store, model=Net(), input_shapes=[[-1, 4]],
                             feature_cols=["features"], label_cols=["label"], batch_size=16, epochs=6,
                             validation=0.1, verbose=0, callbacks=[EpochCounter(epochs_seen)],
                             run_id="run1").fit(train_df)
default_columns = resumed.getOutputCols()  # Horovod's name: <label>__output
resumed_accuracy = evaluator.evaluate(resumed.setOutputCols(["label_prob"]).transform(test_df)
                                      .withColumn("label_pred", argmax("label_prob")))
history = torch_model.getHistory()
spark.stop()
print("RESULT " + json.dumps({
    "accuracy": accuracy, "resumed_accuracy": resumed_accuracy, "columns": columns,
    "default_columns": default_columns,
    "same_after_load": same_after_load, "checkpoint": checkpoint, "history": history,
    "resumed_history": resumed.getHistory(),
    "train_epochs": [int(n) for n in open(epochs_seen).read().split()],
}))
