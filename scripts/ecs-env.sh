#!/usr/bin/env bash
# The AWS CLI, boto3 and moto's ECS test suite, from PyPI at pinned versions, for the tests of
# the ECS-compatible API; in target/ecs-env, nothing installed system-wide:
#   sdk/        boto3 and botocore 1.44.8 (they model MPS's sharingStrategy), pytest, moto, and
#               flask and flask-cors for moto_server (the EC2 provider's tests run moto as a server)
#   cli/        the AWS CLI 1.46.3 (its own botocore 1.43 does not: see docs/ecs-api.md)
#   moto-tests/ moto's tests/test_ecs from its source distribution
#   ecs-model/  botocore 1.44.8's ECS model, for `aws configure add-model`
# Prints the folder on its last line. Run again, it only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

BOTOCORE=1.44.8
MOTO=5.2.5
PYTEST=9.2.0
AWSCLI=1.46.3
FLASK=3.1.3
FLASK_CORS=6.0.5
DIR="$PWD/target/ecs-env"
mkdir -p "$DIR"

if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

venv() { # venv NAME PACKAGES...
  local name=$1; shift
  local stamp="$DIR/$name/.installed"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$*" ]]; then
    return
  fi
  rm -rf "${DIR:?}/$name"
  python3 -m venv "$DIR/$name"
  "$DIR/$name/bin/pip" install -q --disable-pip-version-check "$@" >&2
  echo "$*" > "$stamp"
}

venv sdk "boto3==$BOTOCORE" "botocore==$BOTOCORE" "pytest==$PYTEST" "moto==$MOTO" \
  "flask==$FLASK" "flask-cors==$FLASK_CORS"
venv cli "awscli==$AWSCLI"

if [[ ! -f "$DIR/moto-tests/.version" || "$(cat "$DIR/moto-tests/.version")" != "$MOTO" ]]; then
  rm -rf "$DIR/moto-tests" "$DIR/moto-sdist"
  mkdir -p "$DIR/moto-sdist" "$DIR/moto-tests/tests"
  "$DIR/sdk/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$DIR/moto-sdist" "moto==$MOTO" >&2
  tar -xzf "$DIR/moto-sdist/moto-$MOTO.tar.gz" -C "$DIR/moto-sdist"
  cp "$DIR/moto-sdist/moto-$MOTO/tests/__init__.py" "$DIR/moto-tests/tests/"
  cp -r "$DIR/moto-sdist/moto-$MOTO/tests/test_ecs" "$DIR/moto-tests/tests/"
  echo "$MOTO" > "$DIR/moto-tests/.version"
fi

# botocore 1.44.8's ECS model, which the AWS CLI is given with `aws configure add-model`.
if [[ ! -f "$DIR/ecs-model/service-2.json" ]]; then
  mkdir -p "$DIR/ecs-model"
  "$DIR/sdk/bin/python" - "$DIR/ecs-model/service-2.json" <<'PY'
import gzip, json, pathlib, sys, botocore
data = pathlib.Path(botocore.__file__).parent / "data" / "ecs" / "2014-11-13"
raw = (data / "service-2.json.gz").read_bytes() if (data / "service-2.json.gz").exists() else None
text = gzip.decompress(raw) if raw else (data / "service-2.json").read_bytes()
json.loads(text)
pathlib.Path(sys.argv[1]).write_bytes(text)
PY
fi
echo "$DIR"
