#!/usr/bin/env bash
# Entry point of the raydist image.
#   executor  - a Spark-on-Kubernetes executor pod: Spark's driver passes the
#               executor's settings as SPARK_* environment variables.
#   anything else runs as given (the control plane runs `raydist serve`).
set -euo pipefail
if [ "${1:-}" != "executor" ]; then
  exec "$@"
fi
shift
java_opts=()
# Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in order.
while IFS='=' read -r name _; do
  java_opts+=("${!name}")
done < <(env | grep -E '^SPARK_JAVA_OPT_[0-9]+=' | sort -t_ -k4 -n)
classpath="${SPARK_HOME}/jars/*${SPARK_EXTRA_CLASSPATH:+:$SPARK_EXTRA_CLASSPATH}"
exec java "${java_opts[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
