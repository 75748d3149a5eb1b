#!/usr/bin/env bash
# Fetches NVIDIA's MPS binaries (Debian bookworm non-free package `nvidia-cuda-mps`) into
# <repo>/target/mps for the process tests, without touching the system's apt configuration and
# without installing anything (works as root or as a normal user, no sudo).
#
# Prints the path of `nvidia-cuda-mps-control` on its last line: the one on PATH if the machine
# already has it, else <repo>/target/mps/usr/bin/nvidia-cuda-mps-control.
#
# Usage: bash scripts/install-mps.sh
# Environment: MPS_DEBIAN_MIRROR (default: the host of this machine's Debian sources, else
# http://deb.debian.org/debian), MPS_DEBIAN_SUITE (default bookworm).
set -euo pipefail

die() {
  echo "install-mps: $*" >&2
  exit 1
}
log() {
  echo "install-mps: $*" >&2
}

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo/target/mps"
control="$dest/usr/bin/nvidia-cuda-mps-control"

# A machine with the driver's MPS package installed needs nothing.
if existing="$(command -v nvidia-cuda-mps-control 2>/dev/null)"; then
  log "using nvidia-cuda-mps-control from PATH"
  echo "$existing"
  exit 0
fi

# Idempotent: a previous run already unpacked it.
if [[ -x "$control" ]]; then
  log "already unpacked in $dest"
  echo "$control"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script needs a Debian-based machine (or put nvidia-cuda-mps-control on PATH)"
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this script needs a Debian-based machine"

# Reuse the mirror this machine already uses for Debian (it may be a proxy or a local mirror).
find_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # deb822: "URIs: http://host/debian" in a stanza whose suites include bookworm.
    uri="$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f")"
    if [[ -n "$uri" ]] && grep -qiE '^Suites:.*\bbookworm\b' "$f"; then
      echo "$uri"
      return 0
    fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    uri="$(awk '$1 == "deb" && $0 ~ /bookworm/ && $0 !~ /security/ {
      for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f")"
    if [[ -n "$uri" ]]; then
      echo "$uri"
      return 0
    fi
  done
  echo "http://deb.debian.org/debian"
}

mirror="${MPS_DEBIAN_MIRROR:-$(find_mirror)}"
suite="${MPS_DEBIAN_SUITE:-bookworm}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r "$keyring" ]] || die "$keyring not readable: install the debian-archive-keyring package"

work="$(mktemp -d "${TMPDIR:-/tmp}/install-mps.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
echo "deb [signed-by=$keyring] $mirror $suite non-free" >"$work/sources.list"

apt_opts=(
  -o "Dir::Etc::SourceList=$work/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache"
  -o "Debug::NoLocking=1"
)
# As root, apt drops to the _apt user for downloads, which cannot write to our private folders.
if [[ "$(id -u)" -eq 0 ]]; then
  apt_opts+=(-o "APT::Sandbox::User=root")
fi

log "fetching the package index of $mirror $suite non-free"
if ! apt-get "${apt_opts[@]}" -qq update >"$work/update.log" 2>&1; then
  cat "$work/update.log" >&2
  die "apt-get update failed for $mirror $suite non-free"
fi

# apt-get update exits 0 even when it fetched nothing (it only warns): look for the index.
if ! compgen -G "$work/lists/*_Packages*" >/dev/null; then
  cat "$work/update.log" >&2
  die "no package index fetched from $mirror $suite non-free (is the mirror reachable? set MPS_DEBIAN_MIRROR to override)"
fi

log "downloading nvidia-cuda-mps"
if ! (cd "$work/deb" && apt-get "${apt_opts[@]}" -qq download nvidia-cuda-mps) >"$work/download.log" 2>&1; then
  cat "$work/download.log" >&2
  die "apt-get download nvidia-cuda-mps failed (is $suite non-free reachable from $mirror?)"
fi

shopt -s nullglob
debs=("$work"/deb/nvidia-cuda-mps_*.deb)
[[ ${#debs[@]} -eq 1 ]] || die "expected one nvidia-cuda-mps .deb, found ${#debs[@]}"
log "unpacking $(basename "${debs[0]}")"

# Unpack next to the destination and rename, so an interrupted run leaves no half-unpacked tree.
mkdir -p "$repo/target"
staging="$(mktemp -d "$repo/target/mps.partial.XXXXXX")"
dpkg -x "${debs[0]}" "$staging" || { rm -rf "$staging"; die "dpkg -x failed for ${debs[0]}"; }
[[ -x "$staging/usr/bin/nvidia-cuda-mps-control" ]] || {
  rm -rf "$staging"
  die "the package has no usr/bin/nvidia-cuda-mps-control"
}
chmod 0755 "$staging"
rm -rf "$dest"
mv "$staging" "$dest"

echo "$control"
