#!/usr/bin/env bash
# Runs every model variant of tests/golden/canonical_hashes.txt (3 canonical steps on the small
# Markov data of tests/e2e/lib.sh) and compares the model hashes with the pinned ones, or with
# --write pins what this build gives.
#   scripts/golden_hashes.sh LOCKSTEP [--write]
set -euo pipefail
lockstep=$(realpath "$1")
mode=${2:-check}
src=$(cd "$(dirname "$0")/.." && pwd)
table=$src/tests/golden/canonical_hashes.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The variants: a name and the overrides of the base config. Every [model] option appears in at
# least one line; threads and micro-batches vary beside them (canonical bits must not move).
variants=(
  "base|"
  "rope|--model.pos=rope"
  "rope_theta|--model.pos=rope --model.rope_theta=500000"
  "swiglu|--model.ffn=swiglu"
  "rmsnorm|--model.norm=rmsnorm"
  "gqa|--model.n_kv_heads=2"
  "untied|--model.tie_embeddings=false"
  "nobias|--model.bias=false"
  "llama|--model.ffn=swiglu --model.norm=rmsnorm --model.pos=rope --model.n_kv_heads=1 --model.tie_embeddings=false --model.bias=false"
  "wide|--model.d_model=128 --model.n_layers=1 --model.ffn_hidden=320 --model.vocab_size=512"
  "deep|--model.n_layers=4 --train.micro_batch_size=2 --train.threads=3"
)
cd "$work"
"$lockstep" data synth --out data --order 2 --alphabet 8 --branch 3 --tokens 200000 --seed 7 >/dev/null
"$lockstep" data build --input data/corpus.txt --out data >/dev/null
bash -c "source '$src/tests/e2e/lib.sh' '$lockstep' '$work/cfg' '$src'; write_config '$work/cfg.toml'" >/dev/null
got=$work/got.txt
: > "$got"
for v in "${variants[@]}"; do
  name=${v%%|*}
  flags=${v#*|}
  # shellcheck disable=SC2086
  "$lockstep" train --config cfg.toml --train.steps=3 --train.mode=canonical $flags > "$name.log" 2>&1 \
    || { echo "golden: $name failed: $(tail -3 "$name.log")" >&2; exit 1; }
  hash=$(grep '^model hash ' "$name.log" | awk '{print $3}')
  printf '%s %s %s\n' "$name" "$hash" "$flags" >> "$got"
done
if [ "$mode" = "--write" ]; then
  grep '^#' "$table" > "$work/table"
  cat "$got" >> "$work/table"
  cp "$work/table" "$table"
  echo "golden: wrote ${#variants[@]} hashes to $table"
  exit 0
fi
status=0
while read -r name hash flags; do
  want=$(awk -v n="$name" '$1 == n {print $2}' "$table")
  if [ -z "$want" ]; then
    echo "golden: $name ($flags) is not pinned in $table" >&2; status=1
  elif [ "$want" != "$hash" ]; then
    echo "golden: $name ($flags): model hash $hash, pinned $want" >&2; status=1
  fi
done < "$got"
[ "$status" -eq 0 ] && echo "golden: ${#variants[@]} canonical model hashes as pinned"
exit "$status"
