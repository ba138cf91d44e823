#!/usr/bin/env bash
# llama.cpp's binaries (llama-bench, llama-batched-bench and their libraries), built on a device
# machine by .llama/llama_cpp.sh, carried to the next fresh machine instead of built again.
#
# Why: the build takes 4-6 minutes of a session's 30 minutes of device time on every fresh machine,
# and a machine goes back 30 s after a call, so most calls start fresh (s48: one call's plan lost
# to the wait). The binaries are the same llama.cpp (the same sdist, the same card architecture);
# every figure beside ours is still timed in the same call on the same file.
#
#   bash bench/llama_bin.sh pack OUTDIR    # on the device after a build: xz parts of <= 15 MiB to OUTDIR
#   bash bench/llama_bin.sh unpack         # on the device: the carried parts in .llama/ into BIN, checked
#   bash bench/llama_bin.sh fetch DIR      # here: a call's returned parts into .llama/ (carry [".llama"])
#
# A part comes back as one of the 8 files a call may return (16 MiB each); past MAX_MIB in all the
# binaries are not packed (carrying them would crowd the 64 MiB a call may carry).
set -uo pipefail
BIN=${LLAMA_BIN:-/tmp/llama/build/bin}
HERE=$(cd "$(dirname "$0")/.." && pwd)
STORE=${LLAMA_STORE:-$HERE/.llama}
NAME=llama-bin.tar.xz
PART_MIB=15
MAX_MIB=${LLAMA_BIN_MAX_MIB:-45}

# The binaries run here: every library found, and llama-bench answers --help.
runs() {
  [ -x "$BIN/llama-bench" ] || return 1
  if ldd "$BIN/llama-bench" 2>&1 | grep -q "not found"; then
    ldd "$BIN/llama-bench" | grep "not found" >&2; return 1
  fi
  "$BIN/llama-bench" --help > /dev/null 2>&1
}

case "${1:-}" in
pack)
  out=${2:?pack OUTDIR}
  runs || { echo "llama_bin: no working build at $BIN to pack" >&2; exit 1; }
  tmp=$(mktemp -d)
  # The executables, the libraries they load, and the llama.cpp commit that built them.
  (cd "$BIN" && tar cf - llama-bench llama-batched-bench *.so*) | xz -T0 -6 > "$tmp/$NAME" || exit 1
  mib=$(( $(stat -c %s "$tmp/$NAME") / 1048576 ))
  if [ "$mib" -ge "$MAX_MIB" ]; then
    echo "llama_bin: $mib MiB compressed, past $MAX_MIB: not packed"; rm -rf "$tmp"; exit 0
  fi
  split -b ${PART_MIB}M -d -a 1 "$tmp/$NAME" "$out/$NAME."
  (cd "$tmp" && sha256sum "$NAME") > "$out/$NAME.sha256"
  echo "llama_bin: $mib MiB in $(ls "$out/$NAME".[0-9] | wc -l) part(s) to $out"; rm -rf "$tmp"
  ;;
unpack)
  ls "$STORE/$NAME".[0-9] > /dev/null 2>&1 || exit 1
  tmp=$(mktemp -d)
  cat "$STORE/$NAME".[0-9] > "$tmp/$NAME"
  if ! (cd "$tmp" && sha256sum -c --quiet "$STORE/$NAME.sha256"); then
    echo "llama_bin: carried parts do not match their checksum" >&2; rm -rf "$tmp"; exit 1
  fi
  mkdir -p "$BIN" && xz -dc "$tmp/$NAME" | tar xf - -C "$BIN"; rm -rf "$tmp"
  runs || { echo "llama_bin: the carried binaries do not run here; building" >&2; rm -rf "$BIN"; exit 1; }
  echo "llama_bin: carried binaries unpacked to $BIN"
  ;;
fetch)
  dir=${2:?fetch DIR}
  ls "$dir/$NAME".[0-9] > /dev/null 2>&1 || { echo "llama_bin: no $NAME parts in $dir" >&2; exit 1; }
  mkdir -p "$STORE" && rm -f "$STORE/$NAME".* && cp "$dir/$NAME".[0-9] "$dir/$NAME.sha256" "$STORE"/
  ls -la "$STORE"
  ;;
*) echo "usage: llama_bin.sh pack OUTDIR | unpack | fetch DIR"; exit 2;;
esac
