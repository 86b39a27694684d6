#!/usr/bin/env bash
# Spark GPU discovery script for tests on machines without GPUs.
# With RAYDIST_FAKE_GPU_ADDRESSES set (comma-separated), reports exactly those:
# each standalone worker "host" gets its own. Otherwise reports
# RAYDIST_FAKE_GPUS (default 2) addresses per call; with RAYDIST_FAKE_GPU_DIR
# set, every call on the host takes the next free index n (an atomic mkdir)
# and reports addresses n*k .. n*k+k-1, so the Spark workers of a
# local-cluster own disjoint GPUs, as separate hosts' GPUs would be.
if [ -n "${RAYDIST_FAKE_GPU_ADDRESSES:-}" ]; then
  addrs=""
  IFS=',' read -ra given <<< "$RAYDIST_FAKE_GPU_ADDRESSES"
  for a in "${given[@]}"; do addrs="$addrs\"$a\","; done
  echo "{\"name\": \"gpu\", \"addresses\": [${addrs%,}]}"
  exit 0
fi
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
