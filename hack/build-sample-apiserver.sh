#!/usr/bin/env bash
# Builds upstream's sample-apiserver (k8s.io/sample-apiserver v0.37.2, a tool
# of the module hack/sample-apiserver) into bin/sample-apiserver, for issue
# 57's comparison behind the kube-aggregator. A second run reuses the binary
# unless that module changed.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "${ROOT}"
mkdir -p bin
out=bin/sample-apiserver
if [[ -x ${out} ]] && [[ ${out} -nt hack/sample-apiserver/go.mod && ${out} -nt hack/sample-apiserver/go.sum ]]; then
  exit 0
fi
cd hack/sample-apiserver
# A temporary name, so that an interrupted build never leaves a binary the
# check above would take for current.
go build -o "${ROOT}/${out}.tmp" k8s.io/sample-apiserver
mv "${ROOT}/${out}.tmp" "${ROOT}/${out}"
