#!/usr/bin/env bash
# `lockstep faultcampaign` end to end (a short campaign; the figures of the long ones are in the
# docs): one process and dp2 with ZeRO-1, faults over every kind of site; exit 0 (nothing missed
# at an every-step site, no false alarm); every fault judged; campaign.json with its totals and
# every site class; the table and a well-formed SVG; under dp2 persistent faults, one run each,
# every one stopping its run within one buddy interval naming its rank; bad input one clear error each.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
check() {  # OUT FAULTS CLASSES...
  local out=$1 faults=$2 persistent=$3
  shift 3
  python3 - "$out" "$faults" "$persistent" "$@" <<'PY' || fail "$out: $(cat $out/campaign.md)"
import json, sys, xml.etree.ElementTree as E
out, faults, persistent, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
s = json.load(open(out + "/campaign.json"))
if persistent:
    p = s["persistent"]
    assert p["injected"] == persistent and len(p["runs"]) == persistent, p
    assert p["stopped_exit_8"] == p["within_one_interval"] == p["rank_named"] == persistent, p
else:
    assert "persistent" not in s
t, i = s["totals"], s["interval_sites"]
assert s["judged"] == faults, (s["judged"], faults)
assert t["missed"] == 0 and s["false_alarms"] == 0, (t, s["false_alarms"])
assert t["injected"] + i["injected"] + t["not_applied"] == faults
assert t["detected"] > 0 and i["detected"] > 0, (t, i)
seen = {r["class"] for r in s["records"]}
assert set(classes) <= seen, (classes, seen)
assert all(r["outcome"] in ("detected", "benign", "missed", "undetected", "not_applied") for r in s["records"])
E.parse(out + "/campaign.svg")
PY
  grep -q '^| site | bits | injected | detected | benign | missed | undetected (interval) |' $out/campaign.md \
    || fail "$out: no table"
}

"$LOCKSTEP" faultcampaign --config cfg.toml --faults 60 --every 3 --out one > one.log 2>&1 || fail "one process: $(tail -5 one.log)"
check one 60 0 gemm state activation
"$LOCKSTEP" faultcampaign --config cfg.toml --np 2 --faults 60 --every 3 --persistent 3 --out dp --parallel.dp=2 \
  --parallel.zero=1 --train.threads=1 --parallel.timeout_s=60 > dp.log 2>&1 || fail "dp2: $(tail -5 dp.log)"
check dp 60 3 gemm comm state activation
grep -q '^Persistent faults (one run each, buddy replay every 2 steps): 3 injected, 3 stopped the run with exit 8' dp.log \
  || fail "dp2: no persistent summary: $(grep -i persistent dp.log)"
grep -q '^Every-step sites: [0-9]* injected, [0-9]* detected, [0-9]* benign, 0 missed' dp.log || fail "dp2: no summary"

expect_error "faultcampaign: --np \(3\) must be the run's dp x tp \(2 x 1\)" \
  "$LOCKSTEP" faultcampaign --config cfg.toml --np 3 --parallel.dp=2
expect_error "faultcampaign: --persistent \(2\) needs dp >= 2" "$LOCKSTEP" faultcampaign --config cfg.toml --persistent 2
expect_error "faultcampaign: --faults \(0\) must be >= 1" "$LOCKSTEP" faultcampaign --config cfg.toml --faults 0
expect_error "faultcampaign: --every expects a non-negative integer, got 'x'" \
  "$LOCKSTEP" faultcampaign --config cfg.toml --every x
echo "faultcampaign: every fault judged, nothing missed, no false alarm, reports written"
