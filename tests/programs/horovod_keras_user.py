"""A Horovod user's Keras program, written as Horovod's Keras examples write
it, with only the runner's import changed; run as a script by
tests/test_horovod.py. It prints one RESULT line (JSON) of what a user would check."""

import json
import os

import numpy as np
from pyspark.sql import SparkSession

from raydist.compat import HorovodRunner  # was: from sparkdl import HorovodRunner

spark = SparkSession.builder.master("local-cluster[2,1,2048]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

EPOCHS, LR = 4, 0.05


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    return x, (x @ rng.normal(size=(8, 1))).astype("float32")


def build(tf):
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(1)])
    return model


def train():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())  # every rank starts from different weights...
    model = build(tf)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=LR))
    model.compile(loss="mse", optimizer=opt)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # ...and rank 0's win
        hvd.callbacks.MetricAverageCallback(),
    ]
    x, y = data()
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    history = model.fit(x, y, batch_size=len(x), epochs=EPOCHS, shuffle=False, callbacks=callbacks,
                        verbose=1 if hvd.rank() == 0 else 0)
    weights = [round(float(np.sum(w)), 5) for w in model.get_weights()] + \
        [round(float(np.sum(w * w)), 5) for w in model.get_weights()]

    rates = []
    record = tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: rates.append(round(float(model.optimizer.learning_rate.numpy()), 6)))
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    model.fit(x, y, batch_size=len(x), epochs=4, shuffle=False, callbacks=[warmup, record], verbose=0)
    gathered = hvd.allgather(tf.constant([[float(hvd.rank())]] * (hvd.rank() + 1)))
    return {"rank": hvd.rank(), "size": hvd.size(), "weights": weights, "loss": history.history["loss"],
            "rates": rates, "allgather": gathered.numpy().ravel().tolist(),
            "tf_keras": type(model).__module__.split(".")[0]}


def reference():
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = build(tf)
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(learning_rate=LR))
    x, y = data()
    history = model.fit(x, y, batch_size=len(x), epochs=EPOCHS, shuffle=False, verbose=0)
    weights = [round(float(np.sum(w)), 5) for w in model.get_weights()] + \
        [round(float(np.sum(w * w)), 5) for w in model.get_weights()]
    return {"weights": weights, "loss": history.history["loss"]}


out = {"horovod": HorovodRunner(np=2).run(train), "reference": reference()}
spark.stop()
print("RESULT " + json.dumps(out), flush=True)
