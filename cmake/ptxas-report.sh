#!/usr/bin/env bash
# The CUDA compiler launcher of phasor_add_kernels (cuda/CMakeLists.txt): runs the nvcc command it
# is given, whose -Xptxas=-v makes ptxas report every kernel's registers, shared memory, stack
# frame and spills, and keeps that report in <object>.ptxas beside the object file (a first line
# names the source) instead of printing it; anything else nvcc says (warnings, errors) is printed
# as usual. scripts/cuda-resources.sh --build <dir> reads these reports, so CI checks the kernels
# the build compiled rather than compiling them a second time.
set -uo pipefail
object="" source=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
  -o) object=${args[i + 1]:-} ;;
  -c) source=${args[i + 1]:-} ;;
  esac
done
messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
"$@" 2>"$messages"
status=$?
# ptxas -v's lines: "ptxas info    : ..." and, under "Function properties", an indented
# "N bytes stack frame, N bytes spill stores, N bytes spill loads".
report='^ptxas info|^ +[0-9]+ bytes stack frame'
grep -v -E "$report" "$messages" >&2
if [[ -n $object && $status == 0 ]]; then
  { echo "# source: $source"; grep -E "$report" "$messages"; } >"$object.ptxas"
fi
exit $status
