#!/usr/bin/env bash
# Writes the seed corpus of checkpoint_fuzz: checkpoints written by train() through
# `phasor tasks run` (tiny models: GLA with an MLP, FoX with ALiBi, Gated DeltaNet in float64,
# Performer), each run stopped after 2 of its 4 steps so that its checkpoint stays, stored in the
# target's two modes (checkpoint_fuzz.cpp): byte 0 = 0 and the file as is, byte 0 = 1 and the
# payload alone (the target writes the header with recomputed checksums).
#
#   bash tests/fuzz/make_checkpoint_corpus.sh build/phasor [tests/fuzz/corpus/checkpoint_fuzz]
set -euo pipefail
phasor=$(realpath "$1")
out=${2:-tests/fuzz/corpus/checkpoint_fuzz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.json" <<'EOF'
{
  "name": "fuzz_seed",
  "task": {"name": "parity", "train_lengths": [4], "eval_lengths": [4], "eval_batch": 2},
  "model": {"hidden_size": 4, "num_layers": 1, "num_heads": 2},
  "arms": [
    {"name": "gla", "model": {"mixer": "gla"}},
    {"name": "fox_alibi", "model": {"mixer": "fox", "pos_encoding": "alibi", "mlp": false}},
    {"name": "gdn64", "model": {"mixer": "gated_deltanet", "dtype": "float64", "mlp": false}},
    {"name": "performer", "model": {"mixer": "performer", "mlp": false,
                                    "mixer_options": {"num_features": 2, "seed": 1}}}
  ],
  "train": {"steps": 4, "batch_size": 2, "eval_every": 0, "log_every": 0},
  "lr_grid": [0.01],
  "seeds": [0]
}
EOF
"$phasor" tasks run "$work/config.json" --out "$work/run" --stop-at-step 2 --quiet >/dev/null
mkdir -p "$out"
count=0
for ckpt in "$work"/run/checkpoints/*.ckpt; do
  name=$(basename "$ckpt" .ckpt)
  { printf '\x00'; cat "$ckpt"; } >"$out/${name}_file"
  { printf '\x01'; tail -c +33 "$ckpt"; } >"$out/${name}_payload"
  count=$((count + 2))
done
echo "$count files in $out"
