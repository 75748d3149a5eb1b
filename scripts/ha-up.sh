#!/usr/bin/env bash
# Try the highly available control plane on one machine: a 3-member etcd cluster from Debian's
# etcd-server (scripts/etcd-env.sh) and 3 mpsfleet servers sharing it, one elected leader.
# Prints who leads and how to point the CLI at all three; Ctrl-C stops everything it started.
#
# Usage: bash scripts/ha-up.sh          (data under target/ha; ports 7071-7073)
# Then, in another terminal, with the printed exports:
#   mpsfleet cluster status             # members, leader, lease, store revision
#   kill -9 <the leader's pid>          # another server takes over within the lease TTL (2 s)
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${MPSFLEET_HA_DIR:-$PWD/target/ha}"
base_port="${MPSFLEET_HA_PORT:-7071}"
# MPSFLEET_BIN: an mpsfleet binary to use instead of building the release one.
bin="${MPSFLEET_BIN:-}"
if [[ -z "$bin" ]]; then
  cargo build --release --locked --bin mpsfleet
  bin="$PWD/target/release/mpsfleet"
fi

bash scripts/etcd-env.sh start
eval "$(bash scripts/etcd-env.sh env)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash scripts/etcd-env.sh stop
}
trap cleanup EXIT INT TERM

mkdir -p -m 700 "$dir"
prefix="/mpsfleet-ha"
start() {
  local i=$1
  mkdir -p -m 700 "$dir/s$i"
  "$bin" server --store etcd --etcd-endpoints "$MPSFLEET_TEST_ETCD" --etcd-prefix "$prefix" \
    --leader-ttl 2 --listen "127.0.0.1:$((base_port + i - 1))" --data-dir "$dir/s$i" \
    >"$dir/s$i.out" 2>"$dir/s$i.log" &
  pids+=($!)
  echo "server s$i: pid $!, https://127.0.0.1:$((base_port + i - 1)), output in $dir/s$i.out"
}

# The first server makes the cluster's keys on its first term; the others share its server.key
# (it seals the CA's key and derives the agents' tokens).
start 1
for _ in $(seq 1 100); do [[ -f "$dir/s1/server.key" && -f "$dir/s1/ca.pem" ]] && break; sleep 0.1; done
[[ -f "$dir/s1/server.key" ]] || { cat "$dir/s1.log" >&2; echo "server s1 did not start" >&2; exit 1; }
for i in 2 3; do
  mkdir -p -m 700 "$dir/s$i"
  cp "$dir/s1/server.key" "$dir/s$i/server.key"
  start "$i"
done

servers="https://127.0.0.1:$base_port,https://127.0.0.1:$((base_port + 1)),https://127.0.0.1:$((base_port + 2))"
export MPSFLEET_SERVER="$servers" MPSFLEET_CA_FILE="$dir/s1/ca.pem" MPSFLEET_TOKEN="$(cat "$dir/s1/admin.token" 2>/dev/null || true)"
sleep 1
"$bin" cluster status || true
echo
echo "use the CLI from another terminal:"
echo "  export MPSFLEET_SERVER=$servers MPSFLEET_CA_FILE=$dir/s1/ca.pem MPSFLEET_TOKEN=\$(cat $dir/s1/admin.token)"
echo "agents: mpsfleet agent --server $servers --join-token \$(cat $dir/s1/join.token) ..."
echo "Ctrl-C stops the servers and etcd."
wait
