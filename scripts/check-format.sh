#!/usr/bin/env bash
# Checks that every C++/CUDA source file of the repository is formatted with the repository's
# .clang-format (not only the changed ones). Exits non-zero and lists the files (with the first
# lines of their diff) when any is not; `bash scripts/check-format.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
[[ "${1:-}" == "--fix" ]] && fix=1
mapfile -t files < <(git ls-files '*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do
  if ((fix)); then
    clang-format -i "$f"
  elif ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if ((${#bad[@]})); then
  echo "clang-format: ${#bad[@]} of ${#files[@]} files are not formatted (fix: bash scripts/check-format.sh --fix):" >&2
  for f in "${bad[@]}"; do
    echo "  $f" >&2
    clang-format "$f" | diff -u "$f" - | sed -n '3,12p' >&2 || true
  done
  exit 1
fi
echo "clang-format: all ${#files[@]} source files formatted ($(clang-format --version | sed 's/.*version //'))"
