#!/usr/bin/env bash
# Here, before a device call: unpacks the Debian packages the GPU machine lacks
# (stb_image, libcjson, zlib's headers) into .deps/ and copies CIFAR-10 into
# .data/, both git-ignored; name .deps and .data in the call's carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download libstb-dev libstb0 libcjson-dev libcjson1 zlib1g-dev >/dev/null 2>&1)
rm -rf .deps && mkdir -p .deps/stb .deps/cjson .deps/zlib
for p in libstb-dev libstb0; do dpkg -x "$tmp/${p}_"*.deb .deps/stb; done
for p in libcjson-dev libcjson1; do dpkg -x "$tmp/${p}_"*.deb .deps/cjson; done
dpkg -x "$tmp/zlib1g-dev_"*.deb .deps/zlib
rm -rf "$tmp"
mkdir -p .data
[ -f .data/cifar10-jpg.tar.gz ] || cp ../shared/data/cifar10-jpg.tar.gz .data/
du -sh .deps .data/cifar10-jpg.tar.gz
