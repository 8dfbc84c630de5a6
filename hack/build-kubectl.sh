#!/usr/bin/env bash
# Builds kubectl from k8s.io/kubectl (pinned in go.mod) into bin/kubectl.
# A second run reuses the binary unless go.mod changed.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "${ROOT}"
mkdir -p bin
if [[ -x bin/kubectl && bin/kubectl -nt go.mod && bin/kubectl -nt go.sum ]]; then
  exit 0
fi
go build -o bin/kubectl ./hack/tools/kubectl
