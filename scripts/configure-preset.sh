#!/usr/bin/env bash
# Configures one of CMakePresets.json's presets (cmake --preset NAME). A build folder configured
# earlier with another generator (the sanitizer presets built with Makefiles before 2026-11-28,
# Ninja since) is started afresh, since CMake refuses to switch generators in place.
#   bash scripts/configure-preset.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/configure-preset.sh PRESET}
# The preset's binary folder and generator, following "inherits".
read -r dir generator < <(/usr/bin/python3 - "$name" <<'PY'
import json, sys
presets = {p["name"]: p for p in json.load(open("CMakePresets.json"))["configurePresets"]}
def field(name, key):
    p = presets[name]
    if key in p:
        return p[key]
    for parent in ([p["inherits"]] if isinstance(p.get("inherits"), str) else p.get("inherits", [])):
        value = field(parent, key)
        if value is not None:
            return value
    return None
print(field(sys.argv[1], "binaryDir").replace("${sourceDir}/", ""),
      field(sys.argv[1], "generator") or "Unix Makefiles")
PY
)
cache=$dir/CMakeCache.txt
if [[ -f $cache ]] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$generator" "$cache"; then
  echo "configure-preset: $dir was configured with $(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' \
    "$cache"), the preset uses $generator: removing $dir and configuring afresh"
  rm -rf "$dir"
fi
cmake --preset "$name" >/dev/null
