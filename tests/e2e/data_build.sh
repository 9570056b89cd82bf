#!/usr/bin/env bash
# End-to-end test of `lockstep data`: synth a Markov corpus, build token files from it and from a
# directory of documents, check files and sizes, and check that a truncated file, a bad magic, a
# missing file and bad arguments are refused with exit status 2 and a message naming the file.
# Usage: data_build.sh LOCKSTEP_BINARY WORKDIR SOURCE_DIR
set -euo pipefail

LOCKSTEP=$(realpath "$1")
WORK=$2
mkdir -p "$WORK"
cd "$WORK"
rm -rf synth synth2 docs docs_out docs_out2 bad

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_error PATTERN CMD...: CMD must exit 2 and print an `error:` line matching PATTERN.
expect_error() {
  local pattern=$1; shift
  local rc=0
  "$@" >out.txt 2>err.txt || rc=$?
  [[ $rc -eq 2 ]] || fail "expected exit 2 from '$*', got $rc: $(cat err.txt)"
  grep -Eq "^error: .*$pattern" err.txt || fail "'$*': message does not match '$pattern': $(cat err.txt)"
  echo "ok: refused: $(head -1 err.txt)"
}

file_size() { stat -c %s "$1"; }

# ---- synth + build ----
"$LOCKSTEP" data synth --out synth --tokens 100000 --seed 7 | tee synth.txt
grep -Eq '^entropy rate: [0-9]+\.[0-9]+ nats/token' synth.txt || fail "synth did not print the entropy rate"
[[ $(file_size synth/corpus.txt) -eq 100000 ]] || fail "corpus.txt is not 100000 bytes"
grep -q '"entropy_rate_nats"' synth/source.json || fail "source.json lacks entropy_rate_nats"
[[ -z $(tr -d 'a-p' <synth/corpus.txt) ]] || fail "corpus.txt holds characters outside a..p"

"$LOCKSTEP" data build --input synth/corpus.txt --out synth | tee build.txt
[[ $(grep -c '^wrote ' build.txt) -eq 3 ]] || fail "build did not print one line per output file"
[[ $(file_size synth/train.bin) -eq $((1024 + 2 * 90000)) ]] || fail "train.bin size"
[[ $(file_size synth/val.bin) -eq $((1024 + 2 * 10000)) ]] || fail "val.bin size"
grep -q '"vocab_size": 257' synth/data.json || fail "data.json lacks vocab_size 257"
[[ -z $(find synth -name '.*.tmp.*') ]] || fail "temporary files left behind"

"$LOCKSTEP" data inspect synth/train.bin --vocab-size 257 | tee inspect.txt
grep -q 'synth/train.bin: magic 20240520 version 1 tokens 90000 ' inspect.txt || fail "inspect output"

# The same seed gives the same corpus.
"$LOCKSTEP" data synth --out synth2 --tokens 100000 --seed 7 >/dev/null
cmp -s synth/corpus.txt synth2/corpus.txt || fail "synth is not deterministic"

# ---- a directory of documents: sorted by name, one separator per boundary ----
mkdir -p docs
printf '0123456789' >docs/b.txt
printf 'abcdefghij' >docs/a.txt
printf 'ignored' >docs/readme.md
"$LOCKSTEP" data build --input docs --out docs_out --val-fraction 0.2 >/dev/null
# train: 8 + 1 (token 256) + 8 tokens; val: 2 + 1 + 2.
[[ $(file_size docs_out/train.bin) -eq $((1024 + 2 * 17)) ]] || fail "docs train.bin size"
[[ $(file_size docs_out/val.bin) -eq $((1024 + 2 * 5)) ]] || fail "docs val.bin size"
grep -q 'max_token 256' <("$LOCKSTEP" data inspect docs_out/train.bin) || fail "no separator token in train.bin"
# Several inputs in one --input.
"$LOCKSTEP" data build --input docs/b.txt docs/a.txt --out docs_out2 >/dev/null
grep -q 'docs/a.txt' docs_out2/data.json || fail "second input missing from data.json"

# ---- rejections ----
mkdir -p bad
head -c 100000 synth/train.bin >bad/train.bin
expect_error 'bad/train.bin: truncated: header says 90000 tokens \(181024 bytes\) but file has 100000 bytes' \
  "$LOCKSTEP" data inspect bad/train.bin
cp synth/val.bin bad/magic.bin
printf '\x00\x00\x00\x00' | dd of=bad/magic.bin bs=1 count=4 conv=notrunc status=none
expect_error 'bad/magic.bin: bad magic: header\[0\] is 0, expected 20240520 .*lockstep data build' \
  "$LOCKSTEP" data inspect bad/magic.bin
head -c 10 synth/val.bin >bad/short.bin
expect_error 'bad/short.bin: truncated: file has 10 bytes, shorter than the 1024-byte header' \
  "$LOCKSTEP" data inspect bad/short.bin
expect_error 'bad/none.bin: cannot open token file' "$LOCKSTEP" data inspect bad/none.bin
expect_error 'docs_out/train.bin: token out of range: position 8 holds 256, expected < vocab_size 256' \
  "$LOCKSTEP" data inspect docs_out/train.bin --vocab-size 256
expect_error 'input bad/none.txt: no such file or directory' "$LOCKSTEP" data build --input bad/none.txt --out bad/o
expect_error 'unknown option --frobnicate' "$LOCKSTEP" data build --input docs --out bad/o --frobnicate 1
expect_error 'option --tokens expects an integer' "$LOCKSTEP" data synth --out bad/s --tokens 1e6
expect_error "unknown verb 'frob'" "$LOCKSTEP" data frob

echo "PASS: data_build"
