"""raydist's TensorFlow backend config: Ray Train unpickles it in each run's
TrainController, a fresh process that never touches a tensor, so loading it
must not load TensorFlow (Ray's own ``TensorflowConfig`` does: 8-10 s a run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.component

PROBE = """
import json, os, pickle, sys
config = pickle.loads(pickle.dumps(__import__("raydist.train._tf_backend", fromlist=["TfConfig"]).TfConfig()))
from raydist.train._tf_backend import set_tf_config
set_tf_config(["10.0.0.1:2222", "10.0.0.2:2222"], 1)
print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "backend": config.backend_cls.__name__,
                  "framework": str(config.framework), "tf_config": json.loads(os.environ["TF_CONFIG"])}))
"""


def test_the_backend_config_loads_without_tensorflow_and_names_every_worker() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["tensorflow"] is False
    assert "TENSORFLOW" in seen["framework"].upper()
    assert seen["tf_config"] == {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
                                 "task": {"type": "worker", "index": 1}}
