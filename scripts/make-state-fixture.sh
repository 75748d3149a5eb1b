#!/usr/bin/env bash
# Writes the stored-state fixtures that crates/mpsfleet-server/tests/stored_state.rs loads: the
# state an older build of mpsfleet left, once in a SQLite data dir and once in etcd, so that a
# change to how records are stored or loaded is caught against data a user really has.
#
# Usage: bash scripts/make-state-fixture.sh OLD_MPSFLEET_BINARY OUT_DIR
#   OUT_DIR/sqlite/  the server's data dir (state.db, server.key, ca.pem, tokens)
#   OUT_DIR/etcd/    the same fleet's state in etcd (etcd.json: `etcdctl get --prefix -w json`
#                    under the prefix /fixture), and the data dir the server kept beside it
# etcd must be running: bash scripts/etcd-env.sh start; eval "$(bash scripts/etcd-env.sh env)".
#
# What the fleet holds (the test checks each): pool `gpu` (managed) with one host of two
# emulated H200s, task definition `sleeper:1` (MPS, 1024 MiB), service `web` of 2 replicas,
# one standalone task, an operator token, a secret `db-password`, and a join token.
set -euo pipefail

bin=$(realpath "${1:?usage: make-state-fixture.sh OLD_MPSFLEET_BINARY OUT_DIR}")
out=${2:?usage: make-state-fixture.sh OLD_MPSFLEET_BINARY OUT_DIR}
: "${MPSFLEET_TEST_ETCD:?etcd is not running: bash scripts/etcd-env.sh start; eval \"\$(bash scripts/etcd-env.sh env)\"}"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# fleet NAME [server args...]: a server, one agent and the objects above; stops both cleanly.
fleet() {
  local name=$1 port data
  shift
  port=$(free_port)
  data=$work/$name/data
  mkdir -p "$work/$name"
  "$bin" server --data-dir "$data" --listen "127.0.0.1:$port" "$@" >"$work/$name/server.log" 2>&1 &
  local server=$!
  pids+=("$server")
  for _ in $(seq 100); do [ -s "$data/admin.token" ] && [ -s "$data/ca.pem" ] && break; sleep 0.1; done
  export MPSFLEET_SERVER=https://127.0.0.1:$port MPSFLEET_CA_FILE=$data/ca.pem
  MPSFLEET_TOKEN=$(cat "$data/admin.token")
  export MPSFLEET_TOKEN
  "$bin" pool create gpu --mode managed
  "$bin" agent --server "$MPSFLEET_SERVER" --join-token-file "$data/join.token" --pool gpu \
    --data-dir "$work/$name/agent" --emulate-gpus H200:143771:2 --mps-model --runtime process \
    >"$work/$name/agent.log" 2>&1 &
  local agent=$!
  pids+=("$agent")
  cat >"$work/$name/sleeper.json" <<'EOF'
{"family": "sleeper", "containerDefinitions": [{"name": "main", "command": ["sleep", "3600"],
 "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024, "maxComputePercent": 50}}}]}]}
EOF
  "$bin" taskdef register --file "$work/$name/sleeper.json"
  "$bin" service create web --taskdef sleeper:1 --desired 2 --pool gpu --wait --timeout 60
  "$bin" task run --taskdef sleeper:1 --pool gpu --wait --timeout 60
  "$bin" token create --role operator --description fixture
  printf 'hunter2' >"$work/$name/secret"
  "$bin" secret create db-password --from-file "$work/$name/secret"
  "$bin" join-token create --description fixture
  kill -TERM "$agent"
  wait "$agent" || true
  kill -TERM "$server"
  wait "$server" || true
}

rm -rf "$out/sqlite" "$out/etcd"
mkdir -p "$out/sqlite" "$out/etcd"

fleet sqlite
cp -a "$work/sqlite/data/." "$out/sqlite/"

prefix=/fixture
ETCDCTL_API=3 etcdctl --endpoints "$MPSFLEET_TEST_ETCD" del --prefix "$prefix/" >/dev/null
fleet etcd --store etcd --etcd-endpoints "$MPSFLEET_TEST_ETCD" --etcd-prefix "$prefix"
ETCDCTL_API=3 etcdctl --endpoints "$MPSFLEET_TEST_ETCD" get --prefix "$prefix/" -w json >"$out/etcd/etcd.json"
ETCDCTL_API=3 etcdctl --endpoints "$MPSFLEET_TEST_ETCD" del --prefix "$prefix/" >/dev/null
mkdir -p "$out/etcd/data"
cp -a "$work/etcd/data/." "$out/etcd/data/"
"$bin" --version >"$out/written-by"
echo "fixtures written to $out by $(cat "$out/written-by")"
