#!/usr/bin/env bash
# Spark GPU discovery script for tests on machines without GPUs.
# Reports RAYDIST_FAKE_GPUS (default 2) addresses per call. With
# RAYDIST_FAKE_GPU_DIR set, every call on the host takes the next free index n
# (an atomic mkdir) and reports addresses n*k .. n*k+k-1, so the Spark workers
# of a local-cluster own disjoint GPUs, as separate hosts' GPUs would be.
k="${RAYDIST_FAKE_GPUS:-2}"
n=0
if [ -n "${RAYDIST_FAKE_GPU_DIR:-}" ]; then
  mkdir -p "$RAYDIST_FAKE_GPU_DIR"
  while ! mkdir "$RAYDIST_FAKE_GPU_DIR/$n" 2>/dev/null; do n=$((n + 1)); done
fi
addrs=""
for ((i = 0; i < k; i++)); do
  addrs="$addrs\"$((n * k + i))\","
done
echo "{\"name\": \"gpu\", \"addresses\": [${addrs%,}]}"
