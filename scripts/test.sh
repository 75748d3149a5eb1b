#!/usr/bin/env bash
# Sets up what the tests need and runs every test of the workspace.
# Usage: bash scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is not installed: install Rust from https://rustup.rs (stable, 1.85 or newer)" >&2
  exit 1
fi

# The real NVIDIA MPS control daemon, from Debian's non-free packages, into target/mps
# (no GPU needed; nothing installed system-wide). The agent's process tests drive it.
MPSFLEET_MPS_CONTROL="$(bash scripts/install-mps.sh | tail -n 1)"
export MPSFLEET_MPS_CONTROL

# The process tests start the real binary; build it (and everything else) once, up front.
cargo build --workspace --all-targets --locked
cargo test --workspace --locked "$@"
