#!/usr/bin/env bash
# Run the test suite beside N busy processes per core (default 2), as on a loaded machine,
# and print the elapsed time and the result. Not run by default (it loads the machine).
#
# Usage: bench/loaded_suite.sh [N] [pytest arguments...]
#   bench/loaded_suite.sh                 # the whole suite beside 2 busy processes per core
#   bench/loaded_suite.sh 2 tests/test_spark.py -x
#
# Each busy process is `bash -c 'while :; do :; done'` at the default priority; they are
# killed when the run ends (or is interrupted). Exits with pytest's status.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
per_core="${1:-2}"
[ $# -gt 0 ] && shift
case "$per_core" in
    ''|*[!0-9]*) echo "loaded_suite: N must be a whole number, not '$per_core'" >&2; exit 2 ;;
esac
source "$ROOT/.ci/setup"
cd "$ROOT"

cores="$(nproc)"
busy=()
samples="$(mktemp)"
stop_load() {
    local pid
    for pid in "${busy[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    busy=()
}
trap 'stop_load; rm -f "$samples"' EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < per_core * cores; i++)); do
    bash -c 'while :; do :; done' &
    busy+=("$!")
done
# The 1-minute load average every 30 s, for the report.
(while sleep 30; do cut -d' ' -f1 /proc/loadavg; done) >"$samples" &
busy+=("$!")

start="$(date +%s)"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
elapsed=$(( $(date +%s) - start ))
stop_load
peak="$(sort -g "$samples" | tail -n 1)"
echo "loaded_suite: pytest exit ${status} in $((elapsed / 60)) min $((elapsed % 60)) s beside" \
     "$((per_core * cores)) busy processes (${per_core} per core, ${cores} cores);" \
     "1-min load average peak ${peak:-n/a}, mean $(awk '{s += $1} END {if (NR) printf "%.1f", s / NR; else print "n/a"}' "$samples")"
exit "$status"
