#!/usr/bin/env bash
# Builds the image of README's first session, offline: `mpsfleet/demo:latest`, a busybox
# userland (Debian's busybox-static) whose default command serves a page on port 8080 and
# logs one line per request it answers. No registry and no network: the image goes straight
# into the local Docker Engine (DOCKER_HOST, else /var/run/docker.sock), where
# `mpsfleet up` (image pull behaviour prefer-cached) finds it.
#
# Usage: bash scripts/build-demo-image.sh [IMAGE]    (default mpsfleet/demo:latest)
set -euo pipefail

ref="${1:-mpsfleet/demo:latest}"
docker_bin="$(command -v docker || true)"
[[ -x /usr/bin/docker ]] && docker_bin=/usr/bin/docker
engine_hint='start the system one (systemctl start docker), or a private one from this checkout, as root:
  bash scripts/docker-env.sh start && eval "$(bash scripts/docker-env.sh env)"
then run this script again in the same shell (README.md, "A first session")'
if [[ -z "$docker_bin" ]]; then
  echo "build-demo-image: no docker CLI: install Docker Engine (Debian: apt-get install docker.io), then $engine_hint" >&2
  exit 1
fi
if ! "$docker_bin" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "build-demo-image: no Docker Engine answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}: $engine_hint" >&2
  exit 1
fi
if [[ ! -x /bin/busybox ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends busybox-static >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends busybox-static >&2; }
  else
    echo "build-demo-image: /bin/busybox is missing: install Debian's busybox-static" >&2
    exit 1
  fi
fi

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc" "$rootfs/www"
cp /bin/busybox "$rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [[ "$applet" == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
done
chmod 1777 "$rootfs/tmp"
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
cat >"$rootfs/bin/demo" <<'SH'
#!/bin/sh
# The demo's default command: a page on :8080 that says which task and container served it.
echo "<p>hello from ${MPSFLEET_TASK_ID:-a container} (${MPSFLEET_CONTAINER_NAME:-demo})</p>" >/www/index.html
echo "demo: serving /www on port 8080 as task ${MPSFLEET_TASK_ID:-?}"
exec httpd -f -v -p 8080 -h /www
SH
chmod 755 "$rootfs/bin/demo"
tar -C "$rootfs" -c . | "$docker_bin" import \
  --change 'CMD ["/bin/demo"]' \
  --change 'ENV PATH=/bin' \
  --change 'EXPOSE 8080' \
  - "$ref" >/dev/null
echo "built $ref ($("$docker_bin" image inspect --format '{{.Id}}' "$ref"))"
