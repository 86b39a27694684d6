#!/usr/bin/env bash
# Spark GPU discovery script for the driver in tests on machines without GPUs:
# reports RAYDIST_FAKE_DRIVER_GPUS (comma-separated; default 0,1,2,3).
addrs=""
IFS=',' read -ra given <<< "${RAYDIST_FAKE_DRIVER_GPUS:-0,1,2,3}"
for a in "${given[@]}"; do addrs="$addrs\"$a\","; done
echo "{\"name\": \"gpu\", \"addresses\": [${addrs%,}]}"
