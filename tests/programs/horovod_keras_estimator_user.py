"""Horovod's ``examples/spark/keras/keras_spark_mnist.py``, in its shape, on
a small made-up dataset, with only raydist's alias line added:

    horovod_keras_estimator_user.py (--master MASTER | --connect URL) WORK_DIR

A VectorAssembler's features and a one-hot label vector, ``Store.create``,
a Keras 3 model built on the driver (``from tensorflow import keras``),
``hvd.KerasEstimator(...).fit(train_df)``, ``setOutputCols``, ``transform``,
an argmax UDF and Spark ML's evaluator; then what a user checks next: the
history, the run's checkpoint in the Store, a save/load round trip, and a
second fit resumed from the checkpoint. Prints one RESULT line.
"""

import argparse
import json
import os

from raydist.compat.horovod import use_horovod_alias

use_horovod_alias()  # the one line added to Horovod's example

import horovod.spark.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import pyspark.sql.types as T  # noqa: E402
import tensorflow as tf  # noqa: E402
from _session import session_args, three_classes, user_session  # noqa: E402
from horovod.spark.common.backend import SparkBackend  # noqa: E402
from horovod.spark.common.store import Store  # noqa: E402
from pyspark.ml.evaluation import MulticlassClassificationEvaluator  # noqa: E402
from pyspark.ml.feature import OneHotEncoder, VectorAssembler  # noqa: E402
from pyspark.sql.functions import udf  # noqa: E402
from tensorflow import keras  # noqa: E402

parser = argparse.ArgumentParser()
session_args(parser)
parser.add_argument("work_dir")
args = parser.parse_args()
spark = user_session(args)

df = three_classes(spark)  # which of three numbers is largest
df = VectorAssembler(inputCols=["x0", "x1", "x2", "x3"], outputCol="features").transform(df)
encoder = OneHotEncoder(inputCols=["label"], outputCols=["label_vec"], dropLast=False)
df = encoder.fit(df).transform(df).select("features", "label", "label_vec")
train_df, test_df = df.randomSplit([0.8, 0.2], seed=1)

store = Store.create(args.work_dir)


def build():
    return keras.models.Sequential([
        keras.Input(shape=(4,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])


tf.random.set_seed(0)
model = build()
optimizer = keras.optimizers.Adam(learning_rate=0.02)
loss = keras.losses.categorical_crossentropy
backend = SparkBackend(num_proc=2)
keras_estimator = hvd.KerasEstimator(backend=backend, store=store, model=model, optimizer=optimizer, loss=loss,
                                     metrics=["accuracy"], feature_cols=["features"], label_cols=["label_vec"],
                                     batch_size=16, epochs=4, validation=0.1, verbose=1, run_id="run1",
                                     random_seed=3)
keras_model = keras_estimator.fit(train_df).setOutputCols(["label_prob"])

pred_df = keras_model.transform(test_df)
argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
evaluator = MulticlassClassificationEvaluator(predictionCol="label_pred", labelCol="label", metricName="accuracy")
accuracy = evaluator.evaluate(pred_df)
columns = pred_df.columns
prob_type = type(pred_df.schema["label_prob"].dataType).__name__
predictions = [r.label_pred for r in pred_df.orderBy("features").select("label_pred").collect()]

# Save, load, predict the same.
path = os.path.join(args.work_dir, "saved-model")
keras_model.save(path)
loaded = hvd.KerasModel.load(path).setOutputCols(["label_prob"])
again = loaded.transform(test_df).withColumn("label_pred", argmax("label_prob"))
same_after_load = [r.label_pred for r in again.orderBy("features").select("label_pred").collect()] == predictions

run_dir = store.get_checkpoint_path("run1")
checkpoint_before = sorted(f for f in os.listdir(run_dir) if f.startswith("checkpoint"))
# A second fit under the same run_id resumes from that checkpoint.
resumed = hvd.KerasEstimator(backend=SparkBackend(num_proc=2), store=store, model=build(),
                             optimizer=keras.optimizers.Adam(learning_rate=0.02), loss=loss, metrics=["accuracy"],
                             feature_cols=["features"], label_cols=["label_vec"], batch_size=16, epochs=1,
                             run_id="run1", verbose=0).fit(train_df)
default_columns = resumed.getOutputCols()  # Horovod's name: <label>__output
resumed_history = resumed.getHistory()
history = keras_model.getHistory()
trained = keras_model.getModel()
spark.stop()
print("RESULT " + json.dumps({
    "accuracy": accuracy, "columns": columns, "prob_type": prob_type, "default_columns": default_columns,
    "same_after_load": same_after_load, "checkpoint": checkpoint_before, "history": history,
    "resumed_history": resumed_history, "keras": type(trained).__module__.split(".")[0],
    "optimizer_lr": float(np.asarray(trained.optimizer.learning_rate)),
    "logs": sorted(os.listdir(store.get_logs_path("run1"))),
}))
