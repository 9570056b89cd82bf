#!/usr/bin/env bash
# lockstep schedule: each schedule's table, timeline and bubble for pp 4 and 8 micro-batches — the
# bubble equal to the literature's formula on unit costs (1F1B 27.27%, interleaved with 2 chunks
# 15.79%, ZB-H1 11.11%), a well-formed SVG and JSON whose passes each rank runs once; shapes a
# schedule cannot take are one error line each.
source "$(dirname "$0")/lib.sh"
for spec in "gpipe|1|27.27" "1f1b|1|27.27" "interleaved|2|15.79" "zb|1|11.11"; do
  IFS='|' read -r kind chunks bubble <<< "$spec"
  "$LOCKSTEP" schedule --pp 4 --microbatches 8 --schedule "$kind" --virtual-stages "$chunks" --svg "$kind.svg" \
    --json "$kind.json" > "$kind.txt" || fail "$kind: $(cat "$kind.txt")"
  grep -q "^bubble $bubble% of pp x makespan (formula $bubble%" "$kind.txt" || fail "$kind: $(tail -1 "$kind.txt")"
  [ "$(grep -c '^rank  [0-3]:' "$kind.txt")" = 4 ] || fail "$kind: not four ranks' passes: $(cat "$kind.txt")"
  [ "$(grep -c '^rank  [0-3] |' "$kind.txt")" = 4 ] || fail "$kind: no timeline: $(cat "$kind.txt")"
  /usr/bin/python3 - "$kind.svg" "$kind.json" "$chunks" <<'PY' || fail "$kind: SVG or JSON"
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith("svg"), root.tag
j = json.load(open(sys.argv[2]))
chunks = int(sys.argv[3])
assert j["pp"] == 4 and j["microbatches"] == 8 and abs(j["bubble"] - j["bubble_formula"]) < 1e-12, j
per_pass = 3 if j["schedule"] == "zb" else 2
for rank in j["ranks"]:
    assert len(rank) == per_pass * 8 * chunks, len(rank)
    assert all(a["end"] <= b["start"] + 1e-12 for a, b in zip(rank, rank[1:]))
PY
done
grep -q '^rank  0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7$' 1f1b.txt || fail "1F1B rank 0: $(grep '^rank  0:' 1f1b.txt)"
"$LOCKSTEP" schedule --pp 4 --microbatches 8 --costs 1,1.5,0.5 --p2p 0.25 > costs.txt
grep -q 'timeline: not drawn' costs.txt || fail "fractional costs drawn as columns: $(cat costs.txt)"
expect_error "needs the micro-batches of a step \(6\) to be a multiple of pp \(4\)" \
  "$LOCKSTEP" schedule --pp 4 --microbatches 6 --schedule interleaved --virtual-stages 2
expect_error "interleaved schedule needs virtual_stages >= 2" "$LOCKSTEP" schedule --pp 4 --microbatches 8 --schedule interleaved
expect_error "expected \"gpipe\", \"1f1b\", \"interleaved\" or \"zb\", got \"zb2\"" \
  "$LOCKSTEP" schedule --pp 4 --microbatches 8 --schedule zb2
expect_error "--costs expects F,Bi,W" "$LOCKSTEP" schedule --pp 4 --microbatches 8 --costs 1,2
expect_error "--pp P and --microbatches M are required" "$LOCKSTEP" schedule --pp 4
echo PASS
