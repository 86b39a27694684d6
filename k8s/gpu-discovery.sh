#!/usr/bin/env bash
# Spark GPU discovery for executor pods: the GPUs this container sees, as
# Spark's resource JSON. Baked into the image at /opt/raydist/gpu-discovery.sh.
set -euo pipefail
ids=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
echo "{\"name\": \"gpu\", \"addresses\": [\"${ids//,/\",\"}\"]}"
