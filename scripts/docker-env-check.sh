#!/usr/bin/env bash
# Checks that the private Docker environment of scripts/docker-env.sh does what the container
# runtime's tests rely on, on this machine: run a container, publish a port on 127.0.0.1 and
# reach it, pull the test image back from the local registry, see a memory-limit OOM kill in
# `docker inspect` (and tell it from a plain SIGKILL), apply CPU and pids limits, stop a
# container with SIGTERM through the init process, and leave nothing running after `stop`.
#
# Usage: bash scripts/docker-env-check.sh   (as root; uses its own MPSFLEET_DOCKER_DIR unless set)
# Exits non-zero, naming the check, on the first one that fails.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MPSFLEET_DOCKER_DIR="${MPSFLEET_DOCKER_DIR:-$repo/target/docker-check}"
env_sh="$repo/scripts/docker-env.sh"
D=/usr/bin/docker

fail() {
  echo "docker-env-check: FAILED: $*" >&2
  exit 1
}
pass() {
  echo "docker-env-check: ok: $*" >&2
}
expect() { # expect WHAT WANTED GOT
  [[ "$2" == "$3" ]] || fail "$1: wanted '$2', got '$3'"
  pass "$1 ($3)"
}

trap 'bash "$env_sh" stop' EXIT

start_s=$SECONDS
bash "$env_sh" start
pass "start took $((SECONDS - start_s))s"
bash "$env_sh" start
pass "a second start is accepted"
eval "$(bash "$env_sh" env)"
I="$MPSFLEET_TEST_IMAGE"

expect "busybox echo" ok "$($D run --rm "$I" /bin/busybox echo ok 2>/dev/null)"
$D rm -f mpsfleet-check-cmd >/dev/null 2>&1 || true
$D run -d --name mpsfleet-check-cmd "$I" >/dev/null 2>&1
out=""
for _ in $(seq 50); do
  out="$($D logs mpsfleet-check-cmd 2>&1 | head -n 1)"
  [[ -n "$out" ]] && break
  sleep 0.1
done
expect "default command" "hello from the image" "$out"
$D rm -f mpsfleet-check-cmd >/dev/null

# Published port on 127.0.0.1, reached from the host through docker-proxy.
$D rm -f mpsfleet-check-web >/dev/null 2>&1 || true
$D run -d --name mpsfleet-check-web -p 127.0.0.1::8080 "$I" /bin/sh -c \
  'mkdir -p /www && echo served > /www/index.html && exec httpd -f -p 8080 -h /www' >/dev/null 2>&1
hostport="$($D port mpsfleet-check-web 8080/tcp | head -n 1)"
[[ "$hostport" == 127.0.0.1:* ]] || fail "published port: wanted 127.0.0.1:<port>, got '$hostport'"
body=""
for _ in $(seq 50); do
  body="$(curl -fsS --max-time 2 "http://$hostport/" 2>/dev/null || true)"
  [[ -n "$body" ]] && break
  sleep 0.1
done
expect "GET http://$hostport/" served "$body"
$D rm -f mpsfleet-check-web >/dev/null

# Pull from the local registry after removing the image from the engine.
$D rmi "$I" >/dev/null
$D pull -q "$I" >/dev/null
expect "pull from $MPSFLEET_TEST_REGISTRY" "$I" "$($D image inspect -f '{{index .RepoTags 0}}' "$I")"

# OOM kill of the main process under a memory limit.
$D rm -f mpsfleet-check-oom >/dev/null 2>&1 || true
$D run --name mpsfleet-check-oom --memory 32m "$I" /bin/sh -c 'exec tail /dev/zero' >/dev/null 2>&1 || true
expect "OOM kill seen by inspect" "true 137" \
  "$($D inspect -f '{{.State.OOMKilled}} {{.State.ExitCode}}' mpsfleet-check-oom)"
$D rm mpsfleet-check-oom >/dev/null

# A plain SIGKILL is not reported as an OOM kill.
$D run -d --name mpsfleet-check-kill "$I" >/dev/null 2>&1
$D kill -s KILL mpsfleet-check-kill >/dev/null
$D wait mpsfleet-check-kill >/dev/null
expect "SIGKILL is not OOM" "false 137" \
  "$($D inspect -f '{{.State.OOMKilled}} {{.State.ExitCode}}' mpsfleet-check-kill)"
$D rm mpsfleet-check-kill >/dev/null

# Limits reach the container's cgroups (v1 paths; v2 has one file per limit under one root).
# shellcheck disable=SC2016 # expanded in the container
limits="$($D run --rm --memory 64m --cpus 0.5 --pids-limit 50 "$I" /bin/sh -c '
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "$(cat /sys/fs/cgroup/memory.max) $(cat /sys/fs/cgroup/cpu.max) $(cat /sys/fs/cgroup/pids.max)"
  else
    echo "$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes) $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us) $(cat /sys/fs/cgroup/pids/pids.max)"
  fi' 2>/dev/null | tr '\n' ' ')"
expect "memory, cpu quota/period and pids limits in the container's cgroups" \
  "67108864 50000 100000 50 " "$limits"

# SIGTERM reaches a shell only through the init process (tini, --init); without it, stop kills.
$D run -d --init --name mpsfleet-check-term "$I" /bin/sh -c 'sleep 60' >/dev/null 2>&1
$D stop -t 5 mpsfleet-check-term >/dev/null
expect "stop with --init" 143 "$($D inspect -f '{{.State.ExitCode}}' mpsfleet-check-term)"
$D rm mpsfleet-check-term >/dev/null

# Leave a container running: stop must take it down with the daemons.
$D run -d --name mpsfleet-check-left "$I" >/dev/null 2>&1
trap - EXIT
bash "$env_sh" stop
# Exited processes wait as zombies until init reaps them; only live ones count.
procs="$(ps -eo stat=,args=)"
left="$(awk '$1 !~ /^Z/' <<<"$procs" |
  grep -E "dockerd .*$MPSFLEET_DOCKER_DIR|containerd .*$MPSFLEET_DOCKER_DIR|docker-registry serve $MPSFLEET_DOCKER_DIR|docker-proxy|containerd-shim" || true)"
[[ -z "$left" ]] || fail "processes left after stop: $left"
if grep -q " $MPSFLEET_DOCKER_DIR/" /proc/self/mounts; then
  fail "mounts left under $MPSFLEET_DOCKER_DIR after stop"
fi
pass "nothing left running after stop"
