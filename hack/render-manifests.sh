#!/usr/bin/env bash
# Renders artifacts/deploy into a directory, with a freshly generated CA and
# serving certificate (and the ha variant's etcd certificates). Usage: hack/render-manifests.sh OUT_DIR [-namespace NS] [-image IMAGE]
set -o errexit -o nounset -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR [-namespace NS] [-image IMAGE]" >&2
  exit 2
fi
out=$1
shift
cd "${ROOT}"
go run ./hack/tools/render-manifests -in artifacts/deploy -out "${out}" "$@"
echo "rendered manifests in ${out}; apply the trial with: kubectl apply -k ${out}/base, or the highly available install with: kubectl apply -k ${out}/ha"
