#!/bin/sh
# The image's entrypoint: the kernels baked at build time (/opt/minferd/kernel-cache) into CuPy's
# cache directory first (a volume mounted there, as the DaemonSet's emptyDir, starts empty), then
# the daemon as PID 1 (it gets SIGTERM and drains).
set -e
if [ -n "${CUPY_CACHE_DIR:-}" ] && [ -d /opt/minferd/kernel-cache ]; then
  mkdir -p "$CUPY_CACHE_DIR"
  cp -Rn /opt/minferd/kernel-cache/. "$CUPY_CACHE_DIR"/ 2>/dev/null || true
fi
exec minferd "$@"
