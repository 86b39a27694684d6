"""A Spark user who trains inside an MLflow run, as MLflow's docs and
Databricks' notebooks write it: set the tracking server, open a run, train
with ``TorchDistributor(num_processes=2)`` logging a metric per step from
rank 0, end the run.

    mlflow_user.py (--master MASTER | --connect URL) TRACKING_URI

Only the distributor's import is raydist's. Prints one RESULT line: the
run's id, its status while the run was open (after training) and after.
"""

import argparse
import json
import os

import mlflow
from _session import session_args, user_session

from raydist.compat import TorchDistributor

parser = argparse.ArgumentParser()
session_args(parser)
parser.add_argument("tracking_uri")
args = parser.parse_args()
spark = user_session(args)


def train(steps):
    import hashlib
    import os

    import mlflow

    rank = int(os.environ["RANK"])
    for step in range(steps):
        loss = 1.0 / (step + 1)
        if rank == 0:
            mlflow.log_metric("loss", loss, step=step)
    # Whether the rank got the driver's MLflow credential (a digest: the test
    # checks that the credential itself is in no output).
    token = os.environ.get("MLFLOW_TRACKING_TOKEN", "")
    return {"rank": rank, "pid": os.getpid(), "token_sha256": hashlib.sha256(token.encode()).hexdigest()}


mlflow.set_tracking_uri(args.tracking_uri)
mlflow.set_experiment("raydist-mlflow-user")
with mlflow.start_run() as run:
    mlflow.log_param("steps", 5)
    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 5)
    open_status = mlflow.MlflowClient().get_run(run.info.run_id).info.status
status = mlflow.MlflowClient().get_run(run.info.run_id).info.status
spark.stop()
print("RESULT " + json.dumps({"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                              "returned": out, "driver_pid": os.getpid(), "status_while_open": open_status,
                              "status": status}), flush=True)
