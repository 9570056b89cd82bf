#!/usr/bin/env bash
# The layering of docs/architecture.md, checked on the includes and identifiers of the tree:
#  - kernels/ include kernels/ and src/core/ only: kernels know nothing of MPI, models or the trainer;
#  - src/comm/ is the only place that includes mpi.h or nccl.h;
#  - the model's code (src/model/) includes nothing of src/parallel, src/comm, src/train or verify/,
#    and the layers and the model that runs them never name a rank (outside comments);
#  - reference/ includes reference/ and the model's description only (src/model/layer_list.hpp, the
#    config it holds and the precision recipe, src/model/precision.hpp), besides what it shares on purpose as the specification and checks
#    against MPFR itself: the canonical contract, transcendentals and FP8 accumulator model
#    CanonicalF32 is defined by (kernels/ops/canonical.hpp, transcendental.hpp,
#    fp8_accumulation.hpp; the last also in reference/fp8_accumulation.hpp), the deterministic double functions of the
#    canonical RoPE tables (src/core/det_math.hpp) and the narrow formats' roundings that
#    CanonicalF32's bf16 rounding and fp8 quantization are, with the Philox stream of its
#    stochastic rounding (src/core/formats.hpp, src/core/philox.hpp; reference/cast.hpp and
#    reference/quantize.hpp);
#  - verify/core/ (below the trainer) includes neither src/train nor the verify tools; nothing
#    under src/ but the CLI includes a verify tool;
#  - the detectors (verify/detect/, which the trainer attaches) include of the trainer only its
#    observer interface (src/train/step_observer.hpp), and no verify tool;
#  - datasets/ include datasets/ and src/core/ only (src/data builds on them, not the reverse).
#   layering.sh SOURCE_DIR
set -u  # no -e: the greps below find nothing when all is well
shopt -s lastpipe  # refuse, at the end of each pipeline, sets status in this shell
cd "$1"
status=0
# includes FILES...: the quoted includes of the files, as "file: included".
includes() { grep -H -o '^#include "[^"]*"' "$@" 2>/dev/null | sed 's/:#include "/: /; s/"$//' || true; }
# refuse DESCRIPTION PATTERN: lines of stdin matching PATTERN are violations.
refuse() {
  local what=$1 pattern=$2 bad
  bad=$(grep -E "$pattern" || true)
  if [ -n "$bad" ]; then
    echo "layering: $what:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    status=1
  fi
}
files() { find "$@" -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.def' | sort; }

includes $(files kernels) | refuse "kernels/ include beyond kernels/ and src/core/" ': (src/[^c]|src/c[^o]|verify/|reference/|datasets/)'
grep -rlE '#include <(mpi|nccl)\.h>' src kernels verify reference datasets | grep -v '^src/comm/' \
  | refuse "mpi.h or nccl.h outside src/comm" '.'
includes $(files src/model) | refuse "src/model/ includes the parallel layer, comm, the trainer or verify" \
  ': (src/parallel|src/comm|src/train|verify)/'
for f in $(files src/model/layers) src/model/model.hpp src/model/model.cpp src/model/layer.hpp src/model/modules.hpp \
         src/model/modules.cpp; do
  sed 's://.*$::' "$f" | grep -niw 'rank\|ranks' | sed "s|^|$f: |"
done | refuse "the model's code names a rank" '.'
includes $(files reference) | grep -vE ': (reference/|src/model/layer_list\.hpp|src/model/config\.hpp|src/model/precision\.hpp|verify/core/bounds\.hpp)' \
  | grep -vE '^reference/(canonical_f32|canonical_checks)\.hpp: kernels/ops/(canonical|transcendental)\.hpp$' \
  | grep -vE '^reference/(canonical_f32|fp8_accumulation)\.hpp: kernels/ops/fp8_accumulation\.hpp$' \
  | grep -vE '^reference/rope_tables\.hpp: src/core/det_math\.hpp$' \
  | grep -vE '^reference/cast\.hpp: src/core/(formats|philox)\.hpp$' \
  | grep -vE '^reference/quantize\.hpp: src/core/formats\.hpp$' \
  | refuse "reference/ includes beyond itself, the model's description and the canonical contract" '.'
includes $(files verify/core) | refuse "verify/core includes the trainer or a verify tool" ': (src/train/|verify/[^c])'
includes $(files verify/detect) | grep -vE ': src/train/step_observer\.hpp$' \
  | refuse "verify/detect includes the trainer beyond its observer interface, or a verify tool" ': (src/train/|verify/[^cd])'
includes $(files src | grep -v '^src/cli/') | grep ': verify/' | grep -vE ': verify/(core|detect)/' \
  | refuse "src/ (but the CLI) includes a verify tool" '.'
includes $(files datasets) | refuse "datasets/ include beyond datasets/ and src/core/" ': (src/[^c]|verify/|kernels/)'
[ "$status" -eq 0 ] && echo "layering: kernels, comm, model, reference, verify/core, verify/detect and datasets keep their places"
exit "$status"
