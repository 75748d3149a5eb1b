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

# Docker Engine from Debian's docker.io and a local registry from docker-registry, private to
# target/docker (own socket, bridge and data root; nothing system-wide is started), with a
# test image built offline from busybox-static and pushed to the registry on 127.0.0.1. The
# container-runtime tests read DOCKER_HOST, MPSFLEET_TEST_IMAGE and MPSFLEET_TEST_REGISTRY.
bash scripts/docker-env.sh start
eval "$(bash scripts/docker-env.sh env)"
trap 'bash scripts/docker-env.sh stop >/dev/null 2>&1 || true; bash scripts/etcd-env.sh stop >/dev/null 2>&1 || true' EXIT

# A 3-member etcd cluster from Debian's etcd-server, private to target/etcd, for the etcd store
# and the tests of several servers sharing it. They read MPSFLEET_TEST_ETCD.
bash scripts/etcd-env.sh start
eval "$(bash scripts/etcd-env.sh env)"

# openssl makes an operator's CA for the TLS tests, as an operator would.
if ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

# nftables (Debian's nftables): the nemesis test partitions servers from etcd and from their
# clients with DROP rules in a table of its own (crates/mpsfleet/tests/partition).
if ! command -v nft >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables >/dev/null
fi

# A real Prometheus and promtool (Debian's prometheus) scrape a server and an agent in the
# metrics tests and check deploy/'s rules and dashboard queries.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# Stock HAProxy (Debian's haproxy) reads the server's DNS in the traffic tests, with the
# configuration in deploy/haproxy/; the test checks that configuration with `haproxy -c` too.
if ! command -v haproxy >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null
fi

# Headless Chromium (Debian's chromium) runs the web console test.
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# The AWS CLI, boto3 and moto's ECS tests from PyPI (pinned), in target/ecs-env: the ECS-compatible
# API's tests drive them (MPSFLEET_ECS_ENV).
MPSFLEET_ECS_ENV="$(bash scripts/ecs-env.sh | tail -n 1)"
export MPSFLEET_ECS_ENV

# A fresh checkout gains nothing from incremental state, which would double the target folder.
if [[ "${CI:-}" == "true" ]]; then
  export CARGO_INCREMENTAL=0
fi

# The process tests start the real binary; build it (and everything else) once, up front.
cargo build --workspace --all-targets --locked
rm -f target/ecs-conformance.txt
cargo test --workspace --locked "$@"

# moto's ECS suite against the ECS-compatible API (crates/mpsfleet/tests/ecs_conformance.rs).
if [[ -f target/ecs-conformance.txt ]]; then
  cat target/ecs-conformance.txt
fi

# The API contract against the real server: the OpenAPI document validated, every route fuzzed.
bash scripts/fuzz-api.sh
