#!/usr/bin/env bash
# Build dpstream's images from the project's own files, no image registry needed
# (`make images`; run as root where the Debian bases must be made with debootstrap):
#   dpstream/debian-jre:bookworm     debootstrap minbase + a JRE         (made once)
#   dpstream/debian-python:bookworm  debootstrap minbase + python3-venv  (made once)
#   dpstream/kafka:<version>         Kafka's jars (deploy/pom.xml) + kafka-image/run
#   dpstream/worker:latest           deploy/Dockerfile on the python base
# A base that exists is reused; the other two use docker's layer cache, so a rebuild after
# a code change takes seconds. Environment: DOCKER (the client), DEBIAN_MIRROR,
# WORKER_BASE_IMAGE (e.g. python:3.11-slim where Docker Hub answers: no debootstrap then).
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKER=${DOCKER:-docker}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
KAFKA_VERSION=$(sed -n 's/^KAFKA_VERSION = "\(.*\)"$/\1/p' deploy/broker.py)
JRE_BASE=dpstream/debian-jre:$SUITE
PYTHON_BASE=dpstream/debian-python:$SUITE
WORKER_BASE_IMAGE=${WORKER_BASE_IMAGE:-$PYTHON_BASE}
KAFKA_IMAGE=dpstream/kafka:$KAFKA_VERSION
WORKER_IMAGE=dpstream/worker:latest
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
PIP=${PIP:-$PYTHON -m pip}

say() { echo "images: $*"; }

has_image() {
    "$DOCKER" image inspect "$1" >/dev/null 2>&1
}

# A Debian root file system from debootstrap, imported as an image (no registry involved).
debian_base() {
    local tag=$1 packages=$2 dir started=$SECONDS
    dir=$(mktemp -d /var/tmp/dpstream-rootfs.XXXXXX)
    trap 'rm -rf "$dir"' RETURN
    debootstrap --variant=minbase --include="$packages" "$SUITE" "$dir" "$MIRROR" \
        >"$dir.log" 2>&1 || { tail -n 20 "$dir.log" >&2; rm -f "$dir.log"; return 1; }
    rm -f "$dir.log"
    # The downloaded .debs and package lists only make the image bigger.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    # mktemp made the directory 0700; as the image's / it would lock out non-root users.
    chmod 0755 "$dir"
    tar -C "$dir" -c . | "$DOCKER" import --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
    say "$tag made in $((SECONDS - started)) s"
}

# Both bases at once: debootstrap waits mostly on downloads and dpkg, not on one core.
debian_bases() {
    local pids=() pid status=0
    if has_image "$JRE_BASE"; then say "$JRE_BASE exists, reused"; else
        debian_base "$JRE_BASE" openjdk-17-jre-headless & pids+=($!)
    fi
    if [ "$WORKER_BASE_IMAGE" != "$PYTHON_BASE" ] || has_image "$PYTHON_BASE"; then
        say "worker base $WORKER_BASE_IMAGE: exists or not ours to make, no debootstrap"
    else
        debian_base "$PYTHON_BASE" python3,python3-venv & pids+=($!)
    fi
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    if [ "$status" -ne 0 ]; then
        echo "images: a Debian base could not be made (root and debootstrap needed)" >&2
        exit 1
    fi
}

# The worker's dependencies as wheels, fetched on the host: its pip reaches PyPI (and trusts
# the machine's certificates), which a build container need not.
worker_wheels() {
    local started=$SECONDS requirements stamp=deploy/.cache/wheels.requirements
    # The main dependencies and the schema-registry extra (the worker reads every input.format).
    requirements=$("$PYTHON" -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(' '.join(p['dependencies'] + p['optional-dependencies']['schema-registry']))")
    # The same requirements as last time: the wheels there still satisfy them.
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$requirements" ]; then
        say "worker wheels reused"
        return 0
    fi
    # shellcheck disable=SC2086  # PIP may be two words; the requirements are words
    $PIP wheel -q --wheel-dir deploy/wheels "setuptools>=68" wheel $requirements
    echo "$requirements" >"$stamp"
    say "worker wheels ready in $((SECONDS - started)) s"
}

build() {
    local tag=$1 started=$SECONDS
    shift
    "$DOCKER" build -q -t "$tag" "$@" >/dev/null
    say "$tag built in $((SECONDS - started)) s"
}

if [ ! -f "deploy/.cache/kafka-$KAFKA_VERSION/.complete" ]; then
    echo "images: no Kafka jars in deploy/.cache; run 'dpstream broker fetch' first" >&2
    exit 1
fi
debian_bases
build "$KAFKA_IMAGE" --build-arg BASE_IMAGE="$JRE_BASE" \
    --build-arg KAFKA_VERSION="$KAFKA_VERSION" -f deploy/kafka-image/Dockerfile deploy
worker_wheels
build "$WORKER_IMAGE" --build-arg BASE_IMAGE="$WORKER_BASE_IMAGE" --build-arg PIP_NO_INDEX=1 \
    -f deploy/Dockerfile .
