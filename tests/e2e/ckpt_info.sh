#!/usr/bin/env bash
# e2e: `lockstep ckpt info` on a hand-built checkpoint (every byte written here with printf, so the
# on-disk format documented in src/ckpt/checkpoint.hpp is checked independently of the writer),
# and its error paths: missing directory, malformed manifest, corrupt data, a root whose only
# checkpoint is corrupt, an unknown verb. Each error must exit 2 with one `error: ...` line naming
# the file. A full train -> info e2e comes with the trainer.
# Usage: ckpt_info.sh LOCKSTEP_BINARY WORKDIR SOURCE_DIR
set -euo pipefail

bin=$1
work=$2
rm -rf "$work"
mkdir -p "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs the CLI expecting exit status 2 and an error line matching $1 (grep -E).
expect_error() {
  local pattern=$1; shift
  local rc=0
  "$bin" "$@" >"$work/out" 2>"$work/err" || rc=$?
  [[ $rc -eq 2 ]] || fail "lockstep $* exited $rc, expected 2; stderr: $(cat "$work/err")"
  grep -qE "^error: .*$pattern" "$work/err" || fail "lockstep $*: stderr lacks /$pattern/: $(cat "$work/err")"
}

# ---- a valid checkpoint, byte by byte ----
# tensors-00000.bin: 64-byte header ("LSCKDATA", version 1 little-endian, zeros), then
# rng/state (u8 [4] = 01 02 03 04) at offset 64, zero padding to 128, model/w (u8 [2] = 05 06).
# The xxh64 values and the model hash (over model/w only, byte sequence as documented in
# checkpoint.hpp) were computed once with libxxhash and are fixed by the xxh64 specification.
root=$work/run
ck=$root/step_00000012
mkdir -p "$ck"
{
  printf 'LSCKDATA\001\000\000\000'
  head -c 52 /dev/zero
  printf '\001\002\003\004'
  head -c 60 /dev/zero
  printf '\005\006'
} >"$ck/tensors-00000.bin"
[[ $(stat -c %s "$ck/tensors-00000.bin") -eq 130 ]] || fail "hand-built data file is not 130 bytes"
printf '%s\n' '{"format": "lockstep-checkpoint", "version": 1, "step": 12,
 "layout": {"dp": 1, "tp": 1, "pp": 1},
 "files": [{"name": "tensors-00000.bin", "bytes": 130}],
 "tensors": [
  {"name": "rng/state", "dtype": "u8", "shape": [4], "bytes": 4,
   "shards": [{"offsets": [0], "shape": [4], "file": "tensors-00000.bin", "offset": 64, "bytes": 4,
               "xxh64": "542620e3a2a92ed1"}]},
  {"name": "model/w", "dtype": "u8", "shape": [2], "bytes": 2,
   "shards": [{"offsets": [0], "shape": [2], "file": "tensors-00000.bin", "offset": 128, "bytes": 2,
               "xxh64": "e77c8eb5f2cdd680"}]}],
 "model_hash": "64c9c05d8add6bd1",
 "state": {"step": 12}}' >"$ck/manifest.json"

"$bin" ckpt info "$ck" >"$work/info"
grep -qx 'step 12' "$work/info" || fail "no 'step 12' line: $(cat "$work/info")"
grep -qx 'layout dp=1 pp=1 tp=1' "$work/info" \
  || fail "no layout line: $(cat "$work/info")"
grep -qE '^  rng/state +u8 +\[4\] +542620e3a2a92ed1$' "$work/info" || fail "rng/state line: $(cat "$work/info")"
grep -qE '^  model/w +u8 +\[2\] +e77c8eb5f2cdd680$' "$work/info" || fail "model/w line: $(cat "$work/info")"
[[ $(tail -n 1 "$work/info") == 'model hash 64c9c05d8add6bd1' ]] || fail "last line: $(tail -n 1 "$work/info")"

# The root means its newest valid checkpoint; an older corrupt one is never looked at.
mkdir -p "$root/step_00000003"
"$bin" ckpt info "$root" >"$work/info_root"
cmp -s "$work/info" "$work/info_root" || fail "info of the root differs from info of its newest checkpoint"

# ---- error paths ----
expect_error "$work/nope: no such checkpoint directory" ckpt info "$work/nope"
expect_error "unknown verb 'show'" ckpt show "$ck"
expect_error "expected one DIR" ckpt info

# A flipped byte in model/w.
cp -r "$ck" "$work/flipped"
printf '\007' | dd of="$work/flipped/tensors-00000.bin" bs=1 seek=129 conv=notrunc status=none
expect_error "flipped/tensors-00000\.bin: checksum mismatch in tensor 'model/w'" ckpt info "$work/flipped"

# A truncated data file.
cp -r "$ck" "$work/truncated"
truncate -s 100 "$work/truncated/tensors-00000.bin"
expect_error "truncated/tensors-00000\.bin: truncated" ckpt info "$work/truncated"

# A malformed manifest, as a checkpoint and as the only checkpoint of a root.
bad=$work/bad/step_00000001
mkdir -p "$bad"
printf '{"format": "lockstep-checkpoint", "version": ' >"$bad/manifest.json"
expect_error "step_00000001/manifest\.json: malformed JSON" ckpt info "$bad"
expect_error "$work/bad: no checkpoint under this root loads" ckpt info "$work/bad"
grep -qE "^warning: skipping checkpoint .*step_00000001: .*malformed JSON" "$work/err" \
  || fail "no warning naming the skipped checkpoint: $(cat "$work/err")"

echo "ckpt_info: ok"
