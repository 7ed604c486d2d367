#!/bin/sh
# build-image.sh [TAG]: builds flow's image (default flow:dev) from this checkout without
# pulling any image: the binaries are compiled here (deploy/rootfs.sh), then the
# Dockerfile's "prebuilt" stage (FROM scratch) copies them in. Needs Go and Docker.
set -eu
cd "$(dirname "$0")/.."
tag=${1:-flow:dev}
sh deploy/rootfs.sh deploy/out
DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build --target prebuilt -t "$tag" .
echo "built $tag"
