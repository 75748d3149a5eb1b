#!/usr/bin/env bash
# A private 3-member etcd cluster on 127.0.0.1, from Debian's etcd-server package, for the tests
# and benchmarks of the etcd store and of several servers sharing it.
#
# Everything lives under MPSFLEET_ETCD_DIR (default <repo>/target/etcd): each member's data
# directory, log and pid file. Nothing system-wide is started.
#
# Usage:
#   bash scripts/etcd-env.sh start    # install etcd-server if missing, start 3 members (idempotent)
#   bash scripts/etcd-env.sh env      # print `export MPSFLEET_TEST_ETCD=URL,URL,URL` (and the
#                                     # member pid files, for tests that kill one)
#   bash scripts/etcd-env.sh stop     # stop the members, leave nothing running
#   bash scripts/etcd-env.sh status   # etcdctl's endpoint status table
#   bash scripts/etcd-env.sh restart-member N   # start member N again on its data (after a test killed it)
#
# Environment:
#   MPSFLEET_ETCD_DIR      state directory (default <repo>/target/etcd)
#   MPSFLEET_ETCD_PORT     first client port (default 23791; peers use +10); the first free run
#                          of ports from there is taken
set -euo pipefail

die() { echo "etcd-env: $*" >&2; exit 1; }
log() { echo "etcd-env: $*" >&2; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MPSFLEET_ETCD_DIR:-$repo/target/etcd}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running() {
  local pid
  for i in 1 2 3; do
    [[ -f "$dir/m$i.pid" ]] || return 1
    pid="$(cat "$dir/m$i.pid")"
    kill -0 "$pid" 2>/dev/null || return 1
  done
}

endpoints() {
  local base
  base="$(cat "$dir/port")"
  echo "http://127.0.0.1:$base,http://127.0.0.1:$((base + 1)),http://127.0.0.1:$((base + 2))"
}

# Starts member $1 (1-3) on the ports recorded in $dir/port; a member whose data directory
# exists rejoins the cluster with its data.
start_member() {
  local i=$1 base
  base="$(cat "$dir/port")"
  local c=$((base + i - 1)) p=$((base + 9 + i))
  local cluster="m1=http://127.0.0.1:$((base + 10)),m2=http://127.0.0.1:$((base + 11)),m3=http://127.0.0.1:$((base + 12))"
  # Each member gets its own session so that a test's signals to the member never reach it.
  setsid etcd --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "mpsfleet-$base" \
    --max-wals 2 --max-snapshots 2 \
    >>"$dir/m$i.log" 2>&1 </dev/null &
  echo $! >"$dir/m$i.pid"
}

# Each tool this script runs, and the Debian package that has it: a machine that has one of
# them already (etcd-server installed by hand, without etcd-client) gets the other.
install_packages() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v setsid >/dev/null 2>&1 || missing+=(util-linux)
  ((${#missing[@]} == 0)) && return 0
  [[ "$(id -u)" == 0 ]] || die "missing packages ${missing[*]} (etcd, etcdctl, setsid): run as root, or install them first"
  command -v apt-get >/dev/null 2>&1 || die "missing packages ${missing[*]} and no apt-get: this script needs Debian"
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || die "could not install ${missing[*]}"
  command -v etcd >/dev/null 2>&1 || die "etcd is still missing after installing etcd-server"
  command -v etcdctl >/dev/null 2>&1 || die "etcdctl is still missing after installing etcd-client"
}

start() {
  install_packages
  if running; then
    log "already running at $(endpoints)"
    return
  fi
  stop >/dev/null 2>&1 || true
  local base="${MPSFLEET_ETCD_PORT:-23791}"
  while in_use "$base" || in_use $((base + 1)) || in_use $((base + 2)) \
    || in_use $((base + 10)) || in_use $((base + 11)) || in_use $((base + 12)); do
    base=$((base + 20))
  done
  echo "$base" >"$dir/port"
  for i in 1 2 3; do
    rm -rf "$dir/m$i"
    start_member "$i"
  done
  for _ in $(seq 1 120); do
    if ETCDCTL_API=3 etcdctl --endpoints="$(endpoints)" endpoint health >/dev/null 2>&1; then
      log "3 members at $(endpoints)"
      return
    fi
    sleep 0.5
  done
  tail -n 20 "$dir"/m*.log >&2
  die "etcd did not become healthy in 60 s"
}

stop() {
  for i in 1 2 3; do
    if [[ -f "$dir/m$i.pid" ]]; then
      kill "$(cat "$dir/m$i.pid")" 2>/dev/null || true
    fi
  done
  for i in 1 2 3; do
    if [[ -f "$dir/m$i.pid" ]]; then
      local pid
      pid="$(cat "$dir/m$i.pid")"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/m$i.pid"
    fi
  done
}

case "${1:-}" in
  start) start ;;
  env)
    running || die "not running: bash scripts/etcd-env.sh start"
    echo "export MPSFLEET_TEST_ETCD=$(endpoints)"
    echo "export MPSFLEET_TEST_ETCD_DIR=$dir"
    ;;
  stop) stop ;;
  # For tests that kill a member (its pid is in $MPSFLEET_TEST_ETCD_DIR/mN.pid) and bring it back.
  restart-member)
    [[ "${2:-}" =~ ^[123]$ ]] || die "usage: etcd-env.sh restart-member 1|2|3"
    start_member "$2"
    ;;
  status) ETCDCTL_API=3 etcdctl --endpoints="$(endpoints)" endpoint status -w table ;;
  *) die "usage: etcd-env.sh start|env|stop|status" ;;
esac
