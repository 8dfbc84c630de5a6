#!/usr/bin/env bash
# Installs runc from Debian's packages when it is missing: the image test
# runs the image under it (test/integration/image_test.go). CI runs as root.
set -o errexit -o nounset -o pipefail
command -v runc >/dev/null && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends runc >/dev/null || { apt-get update >/dev/null && apt-get install -y --no-install-recommends runc >/dev/null; }
runc --version
