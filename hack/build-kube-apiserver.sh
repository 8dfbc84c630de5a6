#!/usr/bin/env bash
# Builds upstream's kube-apiserver (k8s.io/kubernetes v1.37.2, pinned in
# hack/kube-apiserver/go.mod, a module of its own) into bin/kube-apiserver
# for the control-plane tests. A second run reuses the binary unless that
# module changed. A cold build takes a few minutes on two cores.
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "${ROOT}"
mkdir -p bin
out=bin/kube-apiserver
if [[ -x ${out} ]] && [[ ${out} -nt hack/kube-apiserver/go.mod && ${out} -nt hack/kube-apiserver/go.sum && ${out} -nt hack/kube-apiserver/main.go ]]; then
  exit 0
fi
cd hack/kube-apiserver
# Write to a temporary name so that an interrupted build never leaves a
# binary the check above would take for current.
go build -o "${ROOT}/${out}.tmp" .
mv "${ROOT}/${out}.tmp" "${ROOT}/${out}"
