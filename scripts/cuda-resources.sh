#!/usr/bin/env bash
# GPU resources of every kernel, from ptxas (-Xptxas -v), per architecture: registers, static
# shared memory, stack frame (local memory), spill stores and loads. Exits 1 when a shipped
# kernel spills (or a file does not compile), so it can gate CI.
#   usage: bash scripts/cuda-resources.sh [-a "80 90"] [file.cu ...]
#          bash scripts/cuda-resources.sh --build <build dir>
# Files default to the shipped kernels, cuda/<op>/*.cu (not cuda/simt/, the platform layer), and
# the emulator's test kernels tests/simt_kernels.cu, which are reported but not held to zero
# spills. The flags are the build's (C++17, -O3, --expt-relaxed-constexpr); each file is compiled
# once for all the architectures (a small CUB kernel file takes ~12 s for sm_80 + sm_90 here).
# With --build, nothing is compiled: the reports are the ones ptxas gave when that build (a CMake
# build with the CUDA backend) compiled the files, kept beside each object as <object>.ptxas by
# cmake/ptxas-report.sh, for the build's own architectures and flags; a default file the build
# has no report of is an error. CI's test stage reads its Release build this way.
set -euo pipefail
cd "$(dirname "$0")/.."

archs=${PHASOR_CUDA_ARCHS:-"80 90"}
build=""
if [[ ${1:-} == "-a" ]]; then
  archs=$2
  shift 2
elif [[ ${1:-} == "--build" ]]; then
  build=${2:?"usage: bash scripts/cuda-resources.sh --build <build dir>"}
  shift 2
  if [[ ! -f $build/CMakeCache.txt ]]; then
    echo "cuda-resources: --build $build: not a CMake build folder (no CMakeCache.txt)" >&2
    exit 2
  fi
fi
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ -z $build && ! -x $nvcc ]]; then
  echo "cuda-resources: no nvcc (looked on PATH and at /usr/local/cuda/bin/nvcc; set NVCC)" >&2
  exit 2
fi

if (($# > 0)); then
  files=("$@")
else
  files=()
  for f in cuda/*/*.cu; do
    [[ -e $f && $f != cuda/simt/* ]] && files+=("$f")
  done
  files+=(tests/simt_kernels.cu)
fi

gencode=()
for a in $archs; do gencode+=("--generate-code=arch=compute_$a,code=sm_$a"); done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One file: its rows on stdout, its messages on stderr; status 1 when it does not compile or a
# shipped kernel spills.
report() {
  local f=$1 log="$work/$2.ptxas" shipped start where rows status=0
  shipped=1
  [[ $f == cuda/* ]] || shipped=0
  if [[ -n $build ]]; then
    log=${reports[$(realpath "$f")]:-}
    if [[ -z $log ]]; then
      echo "cuda-resources: $build has no ptxas report of $f (is its CUDA backend on, and built?)" >&2
      return 1
    fi
    where="ptxas report of ${log#"$build"/}"
  else
    start=$(date +%s.%N)
    if ! "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DPHASOR_HAS_CUDA=1 \
      -Iinclude -Isrc -Icuda -Itests "${gencode[@]}" -Xptxas -v -c "$f" -o /dev/null 2>"$log"; then
      cat "$log" >&2
      echo "cuda-resources: $f does not compile" >&2
      return 1
    fi
    # Wall time of its nvcc while up to max_jobs files compile at once: not one core's time.
    where="$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s for $archs, $max_jobs files at a time"
  fi
  # ptxas prints, per entry function and architecture:
  #   Compiling entry function '<mangled>' for 'sm_80'
  #   <n> bytes stack frame, <n> bytes spill stores, <n> bytes spill loads
  #   Used <n> registers, used <n> barriers[, <n> bytes lmem][, <n> bytes smem], ...
  rows=$(awk '
    /Compiling entry function/ {
      match($0, /function .[^ ]+. for/); name = substr($0, RSTART + 10, RLENGTH - 15)
      match($0, /for .sm_[0-9a-z]+./); arch = substr($0, RSTART + 5, RLENGTH - 6)
      stack = 0; stores = 0; loads = 0; next
    }
    /bytes stack frame/ { stack = $1; stores = $5; loads = $9; next }
    /Used [0-9]+ registers/ {
      regs = 0; smem = 0; lmem = 0
      for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^registers/) regs = $i
        if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem = $i
        if ($(i + 1) == "bytes" && $(i + 2) ~ /^lmem/) lmem = $i
      }
      if (lmem > stack) stack = lmem
      print name, arch, regs, smem, stack, stores, loads
    }' "$log")
  while read -r mangled arch regs smem stack stores loads; do
    [[ -z $mangled ]] && continue
    # Demangled, without the namespaces every kernel shares and without the parameter list.
    name=$(echo "$mangled" | c++filt | sed -e 's/(anonymous namespace):://g' -e 's/^void //' \
      -e 's/^phasor::cuda:://' -e 's/(.*)$//')
    printf '%-52s %-6s %5s %9s %9s %12s  %s\n' "$name" "$arch" "$regs" "$smem" "$stack" \
      "$stores/$loads" "$f"
    if ((shipped && (stores > 0 || loads > 0))); then
      echo "cuda-resources: $name spills on $arch ($stores bytes stored, $loads loaded)" >&2
      status=1
    fi
  done <<<"$rows"
  printf '  (%s: %s)\n' "$f" "$where"
  return $status
}

# --build: the build's reports, by the source each names on its first line.
declare -A reports=()
if [[ -n $build ]]; then
  while IFS= read -r -d '' report_file; do
    source_file=$(sed -n '1s/^# source: //p' "$report_file")
    [[ -n $source_file ]] && reports[$(realpath "$source_file")]=$report_file
  done < <(find "$build" -name '*.ptxas' -print0)
fi

# The files compile independently: up to PHASOR_CUDA_JOBS (default: the cores) at a time, the
# largest first (compile time follows size: gated_delta_rule/chunk.cu alone is ~2 of the ~7
# minutes on one core here); the report keeps the files' order.
max_jobs=${PHASOR_CUDA_JOBS:-$(nproc)}
mapfile -t order < <(for i in "${!files[@]}"; do
  echo "$(stat -c %s "${files[$i]}") $i"
done | sort -rn | cut -d' ' -f2)
for i in "${order[@]}"; do
  while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
  (
    status=0
    report "${files[$i]}" "$i" >"$work/$i.out" 2>"$work/$i.err" || status=$?
    echo "$status" >"$work/$i.status"
  ) &
done
wait
status=0
printf '%-52s %-6s %5s %9s %9s %12s  %s\n' kernel arch regs "smem(B)" "stack(B)" "spill st/ld" file
for i in "${!files[@]}"; do
  cat "$work/$i.out"
  cat "$work/$i.err" >&2
  [[ $(cat "$work/$i.status" 2>/dev/null) == 0 ]] || status=1
done
if ((${#files[@]} == 0)); then echo "cuda-resources: no kernel sources"; fi
exit $status
