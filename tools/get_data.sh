#!/usr/bin/env bash
# Puts CIFAR-10 where trainc's configs look for it, in .data/ of this checkout:
#   .data/cifar10-jpg/{train,test}/<class>/*.jpg   (data.source = image_folder, the default)
#   .data/cifar-10-batches-bin/*.bin               (data.source = cifar_bin)
#
#   tools/get_data.sh [TARBALL|FOLDER]
#
# In this order it takes: the tarball or folder given (CIFAR-10's binary
# version, cifar-10-binary.tar.gz, or the JPEG tree, cifar10-jpg.tar.gz); a
# tarball at $TRAINC_DATA, ./cifar-10-binary.tar.gz, ./cifar10-jpg.tar.gz,
# ../shared/data/cifar10-jpg.tar.gz or ~/Downloads/cifar-10-binary.tar.gz;
# else it downloads the binary version from CIFAR-10's home page and checks
# the MD5 published there. When none of these works it says what to do and
# exits 1. It prints the data.source and data.path to use as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

URL=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
MD5=c32a1d4ab5d03f1284b67883e8d87530 # published beside the link on https://www.cs.toronto.edu/~kriz/cifar.html
JPG=.data/cifar10-jpg
BIN=.data/cifar-10-batches-bin

say() { echo "get_data: $*" >&2; }

jpg_complete() { [ -d "$1/train" ] && [ -d "$1/test" ] && [ "$(ls "$1/train" | wc -l)" -ge 2 ]; }
bin_complete() {
  local f
  for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
    [ "$(stat -c %s "$1/$f.bin" 2>/dev/null || echo 0)" -eq 30730000 ] || return 1
  done
}

found() {
  if jpg_complete "$JPG"; then echo "data.source=image_folder data.path=$JPG"; exit 0; fi
  if bin_complete "$BIN"; then echo "data.source=cifar_bin data.path=$BIN"; exit 0; fi
}

# Unpacks a tarball of either form into .data/ and checks what came out.
unpack() {
  local tarball=$1 top
  top=$(tar tzf "$tarball" 2>/dev/null | head -1 | cut -d/ -f1) || true
  case "$top" in
    cifar10-jpg | cifar-10-batches-bin) ;;
    *) say "$tarball is neither cifar-10-binary.tar.gz nor cifar10-jpg.tar.gz (its first entry is '${top:-nothing}')"; return 1 ;;
  esac
  say "unpacking $tarball into .data/"
  mkdir -p .data
  tar xzf "$tarball" -C .data || { say "$tarball did not unpack completely"; return 1; }
  found
  say "$tarball unpacked, but .data/$top is incomplete"
  return 1
}

# A folder already unpacked elsewhere: linked, not copied.
link_folder() {
  local dir
  dir=$(cd "$1" && pwd)
  mkdir -p .data
  if jpg_complete "$dir"; then ln -sfn "$dir" "$JPG"; elif bin_complete "$dir"; then ln -sfn "$dir" "$BIN"; else
    say "$1 holds neither {train,test}/<class>/ images nor the six CIFAR-10 .bin batches"
    return 1
  fi
  found
}

download() {
  local tmp=.data/cifar-10-binary.tar.gz.part
  command -v curl >/dev/null || { say "curl is not installed: cannot download"; return 1; }
  say "downloading $URL (162 MB)"
  mkdir -p .data
  if ! curl -fL --progress-bar --connect-timeout 10 --retry 2 -o "$tmp" "$URL"; then
    rm -f "$tmp"
    say "the download failed (no network, or the site is unreachable)"
    return 1
  fi
  if [ "$(md5sum "$tmp" | cut -d' ' -f1)" != "$MD5" ]; then
    rm -f "$tmp"
    say "the download's MD5 is not the published $MD5: removed it"
    return 1
  fi
  mv "$tmp" .data/cifar-10-binary.tar.gz
  unpack .data/cifar-10-binary.tar.gz && rm -f .data/cifar-10-binary.tar.gz
}

found
if [ $# -gt 0 ]; then
  if [ -d "$1" ]; then link_folder "$1"; elif [ -f "$1" ]; then unpack "$1"; else say "$1: no such file or folder"; fi
  exit 1
fi
for tarball in "${TRAINC_DATA:-}" cifar-10-binary.tar.gz cifar10-jpg.tar.gz ../shared/data/cifar10-jpg.tar.gz \
               "$HOME/Downloads/cifar-10-binary.tar.gz"; do
  [ -n "$tarball" ] && [ -f "$tarball" ] && { unpack "$tarball" || true; }
done
download || true
cat >&2 <<MSG
get_data: no CIFAR-10 here. Do one of these, then run this script again:
  - download $URL
    (MD5 $MD5) and run: tools/get_data.sh PATH/cifar-10-binary.tar.gz
  - or put that file (or cifar10-jpg.tar.gz) in this folder, or name it in TRAINC_DATA=PATH
  - or run: tools/get_data.sh FOLDER, for a folder holding {train,test}/<class>/*.jpg or the .bin batches
MSG
exit 1
