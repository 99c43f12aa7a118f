#!/usr/bin/env bash
# The GPU check with its portability stage beside the others instead of before them
# (scripts/gpu/README.md). On a cold machine both are bound by NVRTC, which compiles
# one kernel at a time per process (about a second per matrix-product candidate on an H200), so
# running them side by side saves the portability stage's minutes. The portability tests use
# their own, empty kernel cache (they never read the shared one) and their GPU work is a few
# small models; they finished within the first step's compilation on the H200.
#
# Usage: bash scripts/gpu/overlap.sh OUT [STAGES] [more haares-gpu-check options]
#   STAGES as for run.sh, without portability (default: first-step,first-step-deep,real-run:
#   stages whose timings the portability tests beside them would disturb are better run alone)
# OUT/portability/ and OUT/check/ then each hold what run.sh leaves in its OUT (8 files at most
# with the default --max-parts: two beside, two and up to four kernel-cache parts here).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: bash scripts/gpu/overlap.sh OUT [STAGES] [options]}"
shift
stages="first-step,first-step-deep,real-run"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    stages="$1"
    shift
fi
case ",$stages," in
    *,portability,*) echo "error: portability runs beside the stages here; leave it out of STAGES" >&2; exit 2 ;;
esac
mkdir -p "$out/portability" "$out/check"
portability_cache="$(mktemp -d)"
HAARES_KERNEL_CACHE="$portability_cache" bash "$root/scripts/gpu/run.sh" "$out/portability" \
    portability "$@" 2>&1 | sed -u 's/^/[beside] /' >&2 &
beside=$!
status=0
bash "$root/scripts/gpu/run.sh" "$out/check" "$stages" "$@" || status=$?
wait "$beside" || status=$?
exit "$status"
