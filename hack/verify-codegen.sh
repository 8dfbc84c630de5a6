#!/usr/bin/env bash
# Fails when generated code is not what hack/update-codegen.sh produces.
set -o errexit -o nounset -o pipefail

SCRIPT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TMP=$(mktemp -d)
trap 'rm -rf "${TMP}"' EXIT

# Copy the tree (without build output) and regenerate there, then diff.
tar -C "${SCRIPT_ROOT}" --exclude=./bin --exclude=./.git --exclude=./.cached-apiserver -cf - . | tar -C "${TMP}" -xf -
(cd "${TMP}" && hack/update-codegen.sh >/dev/null)
for d in pkg/generated pkg/apis hack/api-rules-violations.list; do
  if ! diff -Naupr "${SCRIPT_ROOT}/${d}" "${TMP}/${d}"; then
    echo "generated code in ${d} is out of date: run make generate" >&2
    exit 1
  fi
done
echo "generated code is up to date"
