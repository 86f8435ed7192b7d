#!/usr/bin/env bash
# On the GPU host: waits SECONDS or until every LOG_DIR's progress says "end", then packs the
# LOG_DIRs (and /root/*.out; a job's clocks.csv as clocks.csv.gz) into one $OUT/poll.tgz,
# whatever has finished: a `run` brings back
# only a few files, so each poll returns one archive, and every poll does (the host may go
# back before the next). Prints each LOG_DIR's progress and the e2e rows its logs hold.
# Usage: bash benchmarks/gpu_host/poll.sh SECONDS LOG_DIR ...
set -u
t=${1:?usage: poll.sh SECONDS LOG_DIR ...}
shift
for _ in $(seq 1 "$t"); do
  done_all=1
  for d in "$@"; do grep -q '^end' "$d/progress" 2>/dev/null || done_all=0; done
  [ $done_all = 1 ] && break
  sleep 1
done
# the clock log grows while a job runs: it travels as a compressed copy, taken now
for d in "$@"; do [ -f "$d/clocks.csv" ] && gzip -c "$d/clocks.csv" > "$d/clocks.csv.gz"; done
tar -czf "$OUT/poll.tgz" --exclude=clocks.csv --ignore-failed-read "$@" /root/*.out 2>/dev/null
for d in "$@"; do
  echo "== $d"
  cat "$d/progress" 2>/dev/null
  grep -h " B=[0-9]*: {" "$d"/*.log 2>/dev/null | cut -c1-120
done
