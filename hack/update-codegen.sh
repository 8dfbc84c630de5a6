#!/usr/bin/env bash
# Regenerates deepcopy, defaulting, conversion, OpenAPI and the client
# (clientset, listers, informers, apply configurations) with the
# code-generator pinned in go.mod.
set -o errexit -o nounset -o pipefail

SCRIPT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "${SCRIPT_ROOT}"
# On a fresh machine the module may not be in the cache yet; go list -m
# would then print an empty directory.
go mod download k8s.io/code-generator
CODEGEN_PKG=${CODEGEN_PKG:-$(go list -m -f '{{.Dir}}' k8s.io/code-generator)}
# kube_codegen.sh installs its generators; keep them out of the user's GOBIN.
export GOBIN="${SCRIPT_ROOT}/bin/codegen"
mkdir -p "${GOBIN}"

# shellcheck source=/dev/null
source "${CODEGEN_PKG}/kube_codegen.sh"

THIS_PKG="github.com/cached-apiserver/cached-apiserver"
BOILERPLATE="${SCRIPT_ROOT}/hack/boilerplate.go.txt"

kube::codegen::gen_helpers \
    --boilerplate "${BOILERPLATE}" \
    "${SCRIPT_ROOT}/pkg/apis"

kube::codegen::gen_openapi \
    --output-dir "${SCRIPT_ROOT}/pkg/generated/openapi" \
    --output-pkg "${THIS_PKG}/pkg/generated/openapi" \
    --report-filename "${SCRIPT_ROOT}/hack/api-rules-violations.list" \
    --update-report \
    --output-model-name-file "zz_generated.model_name.go" \
    --boilerplate "${BOILERPLATE}" \
    "${SCRIPT_ROOT}/pkg/apis"

kube::codegen::gen_client \
    --with-watch \
    --with-applyconfig \
    --applyconfig-openapi-schema <(go run "${THIS_PKG}/pkg/generated/openapi/cmd/models-schema") \
    --output-dir "${SCRIPT_ROOT}/pkg/generated" \
    --output-pkg "${THIS_PKG}/pkg/generated" \
    --boilerplate "${BOILERPLATE}" \
    "${SCRIPT_ROOT}/pkg/apis"
