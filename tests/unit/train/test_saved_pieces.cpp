// Tests of saved_pieces (src/train/checkpointing.hpp): the pieces the ranks of a layout write cover
// every element of every global tensor exactly once, for dp × tp × zero layouts of GELU and SwiGLU
// models (tensors split in segments, replicated ones split between tp ranks), and each rank writes
// no more than its share of the largest rank's: no rank writes everything while others write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "src/ckpt/checkpoint.hpp"
#include "src/model/param_layout.hpp"
#include "src/train/checkpointing.hpp"
#include "tests/unit/parallel/small_model.hpp"

namespace lockstep {
namespace {

// The parallel tests' small model with four heads (so that tp 4 divides them) and the given MLP.
ModelConfig model_of(FfnKind ffn) {
  ModelConfig m = parallel::small_model(true);
  m.n_heads = m.n_kv_heads = 4;
  m.ffn = ffn;
  return m;
}

TEST(SavedPieces, EveryLayoutCoversEachElementOnce) {
  for (FfnKind ffn : {FfnKind::kGelu, FfnKind::kSwiglu}) {
    const ModelConfig model = model_of(ffn);
    const std::vector<ParamTensor> global = build_param_layout(model);
    for (int64_t tp : {1, 2, 4}) {
      for (int64_t dp : {1, 2, 3, 4}) {
        for (int64_t zero : {0, 1, 2}) {
          SCOPED_TRACE(testing::Message() << "dp " << dp << " tp " << tp << " zero " << zero);
          std::map<std::string, std::vector<int>> seen;
          for (const ParamTensor& p : global) seen[p.name].assign(static_cast<size_t>(p.numel), 0);
          int64_t most = 0, total = 0;
          for (int64_t w = 0; w < dp * tp; ++w) {
            const std::vector<ParamTensor> slice = build_param_layout(model, {tp, w % tp});
            int64_t mine = 0;
            for (const SavedPiece& piece : saved_pieces(slice, zero, dp, w / tp, {tp, w % tp})) {
              std::string invalid;
              const ckpt::ShardPlace place = piece.place();
              const auto runs = ckpt::place_runs(piece.tensor->global_shape, place, &invalid);
              ASSERT_TRUE(invalid.empty()) << piece.tensor->name << ": " << invalid;
              for (const ckpt::PlaceRun& r : runs) {
                for (int64_t i = 0; i < r.count; ++i) ++seen[piece.tensor->name][static_cast<size_t>(r.global + i)];
              }
              mine += piece.end - piece.first;
            }
            most = std::max(most, mine);
            total += mine;
          }
          for (const auto& [name, counts] : seen) {
            EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int c) { return c == 1; })) << name;
          }
          // Near-equal shares: the largest is within a tensor's worth of the mean.
          EXPECT_LE(most, total / (dp * tp) + model.vocab_size * model.d_model);
        }
      }
    }
  }
}

}  // namespace
}  // namespace lockstep
