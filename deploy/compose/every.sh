#!/bin/sh
# every.sh SECONDS COMMAND [ARGS...]: run COMMAND now, then again every SECONDS seconds, forever.
# A failing round is logged and retried at the next round (the prefixscope commands it runs are
# idempotent: re-ingesting a file adds only new lines, a daily report already sent is not sent
# again). Used by docker-compose.yml for the log tailer, the daily report and the Prometheus
# puller; stop the container to stop it (SIGTERM ends the sleep).
set -u
if [ "$#" -lt 2 ]; then
  echo "usage: every.sh SECONDS COMMAND [ARGS...]" >&2
  exit 2
fi
interval="$1"
shift
trap 'exit 0' TERM INT
while :; do
  "$@" || echo "every.sh: '$*' exited with $? (next round in ${interval}s)" >&2
  sleep "$interval" &
  wait $!
done
