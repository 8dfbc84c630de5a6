#!/usr/bin/env bash
# Builds the image users deploy, as the Dockerfile describes it, without a
# container engine (hack/image): the static binary make build writes, then
# the image, pushed to an in-process registry and pulled back by digest,
# written to bin/image.tar (docker load and podman load read it), its
# filesystem unpacked into bin/image-rootfs for the image test's OCI bundle,
# and its report into bin/image.json. IMAGE names it.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "${ROOT}"
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGE=${IMAGE:-cached-apiserver:${VERSION}}
mkdir -p bin
CGO_ENABLED=0 go build -ldflags "-X github.com/cached-apiserver/cached-apiserver/pkg/version.Version=${VERSION}" \
  -o bin/cached-apiserver ./cmd/cached-apiserver
rm -rf bin/image-rootfs
cd hack/image
go run . build -dockerfile "${ROOT}/Dockerfile" -context "${ROOT}" -tag "${IMAGE}" \
  -out "${ROOT}/bin/image.tar" -rootfs "${ROOT}/bin/image-rootfs" -report "${ROOT}/bin/image.json"
