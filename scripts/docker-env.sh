#!/usr/bin/env bash
# A private Docker Engine and a private image registry for the container-runtime tests.
#
# Everything runs from Debian's own packages (docker.io, docker-registry, busybox-static) and
# lives under one directory, MPSFLEET_DOCKER_DIR (default <repo>/target/docker): the engine's
# socket, data root, exec root, pid files and logs, its own containerd, the registry's storage.
# No system service is started or used, no other registry is ever contacted: the test image is
# built offline from busybox-static and pushed to the local registry.
#
# Usage:
#   bash scripts/docker-env.sh start   # install what is missing, start containerd, dockerd and
#                                      # the registry, build and push the test image (idempotent)
#   bash scripts/docker-env.sh env     # print the `export ...` lines for the tests
#   bash scripts/docker-env.sh stop    # stop everything `start` started, leave nothing running
#   bash scripts/docker-env.sh status  # say what is running
#   bash scripts/docker-env.sh restart-engine  # stop dockerd (SIGTERM) and start it again: a fault
#
# How scripts/test.sh calls it:
#   bash scripts/docker-env.sh start
#   eval "$(bash scripts/docker-env.sh env)"   # DOCKER_HOST, MPSFLEET_TEST_REGISTRY, MPSFLEET_TEST_IMAGE
#   trap 'bash scripts/docker-env.sh stop' EXIT
#   cargo test ...
#
# Environment:
#   MPSFLEET_DOCKER_DIR      state directory (default <repo>/target/docker); keep the path short:
#                            unix socket paths under it must stay below 108 bytes
#   MPSFLEET_REGISTRY_PORT   registry port on 127.0.0.1 (default 5000, else the first free one above)
#   MPSFLEET_DOCKER_BRIDGE   name of the private bridge the engine attaches containers to
#                            (default mpsfdXXXX, from a hash of the directory; never docker0, so
#                            a system engine is left alone); `stop` deletes it
#   MPSFLEET_DOCKER_SUBNET   that bridge's address (default 10.213.N.1/24, N from the same hash)
#   MPSFLEET_DOCKER_STORAGE  storage driver (default overlay2 when an overlay mount works in the
#                            directory, else vfs)
#   MPSFLEET_DOCKER_TIMEOUT  seconds to wait for each daemon to answer (default 60)
#
# The engine runs with --iptables=false --ip-masq=false --ip-forward=false (see start_dockerd): no
# rule is added to the machine's firewall and no sysctl is changed. Published ports (`-p 127.0.0.1::8080`) still work through docker-proxy, the
# userland proxy, for clients on this machine; containers get no outbound NAT (none is needed:
# the only registry is on 127.0.0.1 and is reached by the engine, not by containers).
set -euo pipefail

die() {
  echo "docker-env: $*" >&2
  exit 1
}
log() {
  echo "docker-env: $*" >&2
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${MPSFLEET_DOCKER_DIR:-$repo/target/docker}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
timeout_s="${MPSFLEET_DOCKER_TIMEOUT:-60}"
# Bridge name and subnet derive from the directory, so two checkouts on one machine do not share.
dir_hash="$(printf '%s' "$dir" | cksum | awk '{ print $1 }')"
bridge="${MPSFLEET_DOCKER_BRIDGE:-mpsfd$(printf '%04x' $((dir_hash % 65536)))}"
subnet="${MPSFLEET_DOCKER_SUBNET:-10.213.$((dir_hash % 250 + 1)).1/24}"

sock="$dir/docker.sock"
ctr_sock="$dir/run/containerd/containerd.sock"
image_repo="mpsfleet/busybox"
image_tag="test"

# Debian's client, not whatever else is on PATH (a newer client would negotiate down anyway,
# but the tests must exercise the packaged pair).
DOCKER=/usr/bin/docker
DOCKERD=/usr/sbin/dockerd
CONTAINERD=/usr/bin/containerd
REGISTRY=/usr/bin/docker-registry
BUSYBOX=/bin/busybox

docker_cli() {
  "$DOCKER" -H "unix://$sock" "$@"
}

alive() { # alive PIDFILE: the process named in PIDFILE is running
  local pid
  [[ -s "$1" ]] || return 1
  pid="$(cat "$1")"
  [[ -n "$pid" ]] && running "$pid"
}

log_tail() { # log_tail FILE: the last lines of a daemon's log, for an error message
  if [[ -f "$1" ]]; then
    echo "--- last 30 lines of $1 ---" >&2
    tail -n 30 "$1" >&2
    echo "---" >&2
  fi
}

wait_for() { # wait_for WHAT PIDFILE LOG COMMAND...: until COMMAND succeeds, or die with the log
  local what="$1" pidfile="$2" logfile="$3" waited=0
  shift 3
  until "$@" >/dev/null 2>&1; do
    if ! alive "$pidfile"; then
      log_tail "$logfile"
      die "$what exited during start-up (log: $logfile)"
    fi
    if ((waited >= timeout_s * 10)); then
      log_tail "$logfile"
      die "$what did not answer within ${timeout_s}s (MPSFLEET_DOCKER_TIMEOUT; log: $logfile)"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

install_packages() {
  local missing=()
  [[ -x "$DOCKERD" && -x "$DOCKER" && -x "$CONTAINERD" && -x /usr/sbin/runc ]] || missing+=(docker.io)
  [[ -x "$REGISTRY" ]] || missing+=(docker-registry)
  [[ -x "$BUSYBOX" ]] || missing+=(busybox-static)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  ((${#missing[@]} == 0)) && return 0

  [[ "$(id -u)" == 0 ]] || die "missing packages ${missing[*]}: run as root, or install them first"
  command -v apt-get >/dev/null 2>&1 || die "missing packages ${missing[*]} and no apt-get: this script needs Debian"
  log "installing ${missing[*]}"
  # The packages' maintainer scripts would start system-wide docker, containerd and registry
  # services; a policy-rc.d that refuses every start keeps them stopped. One already in place
  # (container images ship one) is left as it is.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  ((own_policy)) && trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  local rc=0 updated=0
  if ! apt-cache show docker.io docker-registry busybox-static >/dev/null 2>&1; then
    apt-get update -q >&2 || rc=$?
    updated=1
  fi
  if ((rc == 0)); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || rc=$?
  fi
  if ((rc != 0 && updated == 0)); then
    # Package lists older than the mirror name files it no longer has.
    log "apt-get install failed (exit $rc): updating the package lists and trying again"
    rc=0
    apt-get update -q >&2 || rc=$?
    if ((rc == 0)); then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || rc=$?
    fi
  fi
  if ((own_policy)); then
    rm -f "$policy"
    trap - EXIT
  fi
  ((rc == 0)) || die "apt-get install ${missing[*]} failed (exit $rc)"
}

storage_driver() {
  # overlay2 needs an upper directory on a file system that supports it (not overlayfs itself,
  # as inside many containers); vfs always works, at the cost of a full copy per layer, which
  # for a 1 MiB busybox image does not matter.
  if [[ -n "${MPSFLEET_DOCKER_STORAGE:-}" ]]; then
    echo "$MPSFLEET_DOCKER_STORAGE"
    return
  fi
  local probe="$dir/probe.$$"
  mkdir -p "$probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    rm -rf "$probe"
    echo overlay2
  else
    rm -rf "$probe"
    echo vfs
  fi
}

ensure_bridge() {
  # A bridge of our own: the engine's default docker0 and its 172.17/16 would collide with a
  # system engine on the same machine.
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add name "$bridge" type bridge
    ip addr add "$subnet" dev "$bridge"
  fi
  ip link set "$bridge" up
}

start_containerd() {
  local pidfile="$dir/containerd.pid" logfile="$dir/containerd.log"
  if alive "$pidfile"; then
    return 0
  fi
  mkdir -p "$dir/run/containerd" "$dir/containerd"
  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd"
state = "$dir/run/containerd/state"
# The CRI plugin (Kubernetes) is not used and would set up networking of its own.
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "$ctr_sock"

[ttrpc]
  address = "$ctr_sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""
EOF
  rm -f "$ctr_sock" "$ctr_sock.ttrpc"
  : >"$logfile"
  setsid "$CONTAINERD" --config "$dir/containerd.toml" </dev/null >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  wait_for containerd "$pidfile" "$logfile" test -S "$ctr_sock"
}

start_dockerd() {
  local pidfile="$dir/dockerd.pid" logfile="$dir/dockerd.log" driver
  if alive "$pidfile" && docker_cli version >/dev/null 2>&1; then
    return 0
  fi
  driver="$(storage_driver)"
  ensure_bridge
  mkdir -p "$dir/data" "$dir/exec"
  rm -f "$sock"
  # --config-file: our own, so /etc/docker/daemon.json of the machine does not apply; it also
  # keeps the engine's identity key (else /etc/docker/key.json) in the directory.
  printf '{ "deprecated-key-path": "%s" }\n' "$dir/key.json" >"$dir/daemon.json"
  : >"$logfile"
  setsid "$DOCKERD" \
    --config-file "$dir/daemon.json" \
    --host "unix://$sock" \
    --containerd "$ctr_sock" \
    --data-root "$dir/data" \
    --exec-root "$dir/exec" \
    --pidfile "$pidfile.daemon" \
    --storage-driver "$driver" \
    --bridge "$bridge" \
    --iptables=false \
    --ip-masq=false \
    --ip-forward=false \
    --userland-proxy=true \
    --exec-opt native.cgroupdriver=cgroupfs \
    --cgroup-parent mpsfleet-test \
    --log-level info \
    </dev/null >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  wait_for dockerd "$pidfile" "$logfile" docker_cli version
  log "dockerd answers on unix://$sock (storage driver $driver)"
}

port_free() { # port_free PORT: nothing listens on 127.0.0.1:PORT
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_registry() {
  local pidfile="$dir/registry.pid" logfile="$dir/registry.log" port
  if alive "$pidfile" && [[ -s "$dir/registry.port" ]]; then
    return 0
  fi
  port="${MPSFLEET_REGISTRY_PORT:-5000}"
  if [[ -z "${MPSFLEET_REGISTRY_PORT:-}" ]]; then
    while ! port_free "$port"; do
      port=$((port + 1))
      ((port < 5100)) || die "no free port on 127.0.0.1 in 5000-5099 for the registry (set MPSFLEET_REGISTRY_PORT)"
    done
  elif ! port_free "$port"; then
    die "MPSFLEET_REGISTRY_PORT=$port is already in use on 127.0.0.1"
  fi
  mkdir -p "$dir/registry"
  cat >"$dir/registry.yml" <<EOF
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $dir/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
  : >"$logfile"
  setsid "$REGISTRY" serve "$dir/registry.yml" </dev/null >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  wait_for "docker-registry on 127.0.0.1:$port" "$pidfile" "$logfile" \
    curl -fsS "http://127.0.0.1:$port/v2/"
  echo "$port" >"$dir/registry.port"
  log "registry answers on 127.0.0.1:$port"
}

build_image() {
  local port ref rootfs applet
  port="$(cat "$dir/registry.port")"
  ref="127.0.0.1:$port/$image_repo:$image_tag"
  if curl -fs -o /dev/null "http://127.0.0.1:$port/v2/$image_repo/manifests/$image_tag" \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json'; then
    return 0
  fi
  rootfs="$dir/rootfs"
  rm -rf "$rootfs"
  mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
  cp "$BUSYBOX" "$rootfs/bin/busybox"
  for applet in $("$BUSYBOX" --list); do
    [[ "$applet" == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
  done
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  tar -C "$rootfs" -c . | docker_cli import \
    --change 'CMD ["/bin/sh","-c","echo hello from the image; sleep 3600"]' \
    --change 'ENV PATH=/bin' \
    - "$ref" >/dev/null
  rm -rf "$rootfs"
  docker_cli push "$ref" >&2
  log "built and pushed $ref"
}

cmd_start() {
  install_packages
  start_containerd
  start_dockerd
  start_registry
  build_image
}

running() { # running PID: the process exists and has not exited (a zombie waiting for its
  # parent, here init, to reap it has exited)
  local state
  state="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

stop_pid() { # stop_pid NAME PIDFILE: TERM, then KILL after 20 s
  local name="$1" pidfile="$2" pid i
  if alive "$pidfile"; then
    pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
      running "$pid" || break
      sleep 0.1
    done
    if running "$pid"; then
      log "$name (pid $pid) ignored SIGTERM for 20s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

cmd_stop() {
  # Containers first, so no shim outlives the daemons.
  if alive "$dir/dockerd.pid"; then
    local ids
    ids="$(docker_cli ps -aq 2>/dev/null || true)"
    if [[ -n "$ids" ]]; then
      # shellcheck disable=SC2086
      docker_cli rm -f $ids >/dev/null 2>&1 || true
    fi
  fi
  stop_pid registry "$dir/registry.pid"
  rm -f "$dir/registry.port"
  stop_pid dockerd "$dir/dockerd.pid"
  stop_pid containerd "$dir/containerd.pid"
  # Shims of containers that were still running when containerd went away.
  local pid
  for pid in $(pgrep -f "containerd-shim.*-address $ctr_sock" 2>/dev/null || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Mounts the engine left (overlay2 layers, netns, shm) under the directory.
  local m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link delete "$bridge" 2>/dev/null || true
  fi
  rm -f "$sock" "$ctr_sock" "$ctr_sock.ttrpc"
}

cmd_env() {
  [[ -S "$sock" ]] || die "not started: run bash scripts/docker-env.sh start"
  [[ -s "$dir/registry.port" ]] || die "registry not started: run bash scripts/docker-env.sh start"
  local port
  port="$(cat "$dir/registry.port")"
  echo "export DOCKER_HOST=unix://$sock"
  echo "export MPSFLEET_TEST_REGISTRY=127.0.0.1:$port"
  echo "export MPSFLEET_TEST_IMAGE=127.0.0.1:$port/$image_repo:$image_tag"
}

cmd_status() {
  local name
  for name in containerd dockerd registry; do
    if alive "$dir/$name.pid"; then
      echo "$name: running (pid $(cat "$dir/$name.pid"))"
    else
      echo "$name: stopped"
    fi
  done
}

# The Engine stopped (SIGTERM) and started again on its data, as an operator's restart does:
# for a fault that tests inject (`mpsfleet bench soak --restart-docker`).
cmd_restart_engine() {
  [[ -S "$sock" ]] || die "not started: run bash scripts/docker-env.sh start"
  stop_pid dockerd "$dir/dockerd.pid"
  start_dockerd
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
restart-engine) cmd_restart_engine ;;
env) cmd_env ;;
status) cmd_status ;;
*) die "usage: $0 start|stop|env|status|restart-engine" ;;
esac
