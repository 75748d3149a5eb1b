#!/usr/bin/env bash
# Takes docs/console.md's screenshots: runs the console's browser test (real server, agent with
# the real MPS daemon, headless Chromium), which saves the page at each step when
# MPSFLEET_CONSOLE_SCREENSHOTS names a directory. Not part of the tests' run.
# Usage: bash scripts/console-screenshots.sh [output dir, default docs/console]
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-docs/console}")"
MPSFLEET_MPS_CONTROL="$(bash scripts/install-mps.sh | tail -n 1)"
export MPSFLEET_MPS_CONTROL
command -v chromium >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
}
MPSFLEET_CONSOLE_SCREENSHOTS="$out" cargo test -q -p mpsfleet --test console -- a_viewer_signs_in
ls -l "$out"
