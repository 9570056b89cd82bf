#!/usr/bin/env bash
# Faults in a data-parallel job end it promptly and say where ([inject] kinds exit and hang, and a
# parameter bit flipped):
#  - a rank that dies (rank 1 _exit(9) after step 3): the job exits non-zero well within the
#    watchdog timeout, and mpirun's message names rank 1 (process [[job,1],1], exit code 9);
#  - a rank that hangs (rank 1 sleeps after step 3): rank 0's watchdog ends the job after
#    timeout_s with exit code 4 and a message naming the collective and the group's ranks;
#  - a replica that diverges (one parameter bit flipped on rank 1 after step 2): the replica
#    check ends the job with exit code 6 naming dp rank 1;
#  - an AdamW moment flipped on rank 1 after step 2's update: the state-at-rest check names it.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
mpi() { mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.steps=8 --train.threads=1 "$@"; }

status=0
start=$(date +%s)
timeout 120 bash -c "$(declare -f mpi); LOCKSTEP='$LOCKSTEP' mpi --parallel.timeout_s=30 \
  --inject.kind=exit --inject.rank=1 --inject.step=2" > died.log 2>&1 || status=$?
took=$(( $(date +%s) - start ))
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "dead rank: expected a non-zero exit before the timeout, got $status"
[ "$took" -le 30 ] || fail "dead rank: the job took $took s to end (watchdog timeout 30 s)"
grep -Eq "Process name: \[\[[0-9]+,1\],1\]" died.log || fail "dead rank: no message naming rank 1: $(cat died.log)"
grep -q '^done:' died.log && fail "dead rank: the job finished"

status=0
timeout 120 bash -c "$(declare -f mpi); LOCKSTEP='$LOCKSTEP' mpi --parallel.timeout_s=3 \
  --inject.kind=hang --inject.rank=1 --inject.step=2" > hung.log 2>&1 || status=$?
[ "$status" -eq 4 ] || fail "hung rank: expected exit 4 (watchdog), got $status: $(cat hung.log)"
grep -Eq "^rank 0: [a-z_]+ on [a-z]+ group \(world ranks 0,1\) did not complete in 3 s; a peer may have died" hung.log \
  || fail "hung rank: no watchdog message: $(cat hung.log)"

status=0
# The replica check hashes the parameters itself with the state-at-rest check off (on, it takes that
# check's hash from before the flip, and the state-at-rest check finds the flip before the next step).
mpi --verify.replicas=true --verify.state_at_rest=false --inject.site=param/lnf/weight --inject.kind=bitflip:bit=0 \
  --inject.rank=1 --inject.step=1 > flipped.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "flipped bit: expected exit 6 (replicas differ), got $status: $(cat flipped.log)"
[ "$(grep -c '^finding:' flipped.log)" -eq 1 ] || fail "expected one finding line: $(grep '^finding' flipped.log)"
grep -q "^finding: after step 2, detector replicas, site parameters of the dp replicas (tp rank 0), ranks 1: .*world rank 1 has parameter hash" flipped.log \
  || fail "flipped bit: no message naming dp rank 1: $(cat flipped.log)"
# A moment flipped on rank 1 at rest (ZeRO-1: its own shard, which no replica holds): the
# state-at-rest check names rank 1 before the next step.
status=0
mpi --parallel.zero=1 --inject.site=optim/m --inject.kind=bitflip:bit=3,index=10 --inject.rank=1 \
  --inject.step=1 > moment.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "flipped moment: expected exit 6, got $status: $(cat moment.log)"
[ "$(grep -c '^finding:' moment.log)" -eq 1 ] || fail "expected one finding line: $(grep '^finding' moment.log)"
grep -q "^finding: after step 2, detector state_at_rest, site optim/m, ranks 1:" moment.log \
  || fail "flipped moment: no finding naming rank 1: $(cat moment.log)"
echo "mpi_faults: dead rank ended the job in $took s; hang -> watchdog; flipped bit -> replica check; moment -> state at rest"
