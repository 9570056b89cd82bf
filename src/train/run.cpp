#include "src/train/run.hpp"

#include "src/parallel/expert_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"

namespace lockstep {

std::vector<float> TrainRun::gather(const float* local, bool dp_sharded) const {
  std::vector<float> replica;
  if (dp_sharded) {
    replica.resize(static_cast<size_t>(model.num_params()));
    ddp.gather_shards(local, replica.data());
    local = replica.data();
  }
  const EpCoord experts = expert_parallel() ? EpCoord{ep->size(), ep->rank()} : EpCoord{};
  std::vector<float> stage = tensor_parallel()
                                 ? parallel::gather_global(cfg.model, model.param_layout(), local, tp, experts)
                                 : std::vector<float>(local, local + model.num_params());
  if (expert_parallel()) {
    // The whole tensors of this rank's chunks, back to back.
    std::vector<ParamTensor> tensors;
    for (size_t c = 0; c < model.num_chunks(); ++c) {
      for (ParamTensor& t : build_param_layout(model.desc(), {}, model.chunk(c).first, model.chunk(c).end)) {
        t.offset = tensors.empty() ? 0 : tensors.back().offset + tensors.back().numel;
        tensors.push_back(std::move(t));
      }
    }
    stage = parallel::gather_experts(tensors, stage, *ep);
  }
  if (!pipelined()) return stage;
  // Every rank's chunks back to back, then stage by stage: the stages hold consecutive runs of the
  // global layout, in stage order.
  const std::vector<int64_t> counts = pp->all_gather(static_cast<int64_t>(stage.size()));
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  std::vector<float> by_rank(static_cast<size_t>(displs.back() + counts.back()));
  pp->all_gatherv(stage.data(), by_rank.data(), counts, displs, DType::kF32);
  std::vector<float> whole;
  whole.reserve(by_rank.size());
  std::vector<int64_t> read = displs;
  for (size_t s = 0; s < stage_params.size(); ++s) {
    int64_t& from = read[s % counts.size()];
    whole.insert(whole.end(), by_rank.begin() + from, by_rank.begin() + from + stage_params[s]);
    from += stage_params[s];
  }
  return whole;
}

std::span<float> TrainRun::held_params() const {
  if (parallel::Zero3Params* z = ddp.sharded_params()) {
    return {z->shard(), static_cast<size_t>(z->shard_end() - z->shard_first())};
  }
  return {model.params(), static_cast<size_t>(model.num_params())};
}

void TrainRun::held_params_written() {
  if (parallel::Zero3Params* z = ddp.sharded_params()) z->invalidate();
}

void TrainRun::with_whole_params(const std::function<void()>& use) {
  parallel::Zero3Params* z = ddp.sharded_params();
  if (z == nullptr) {
    use();
    return;
  }
  z->hold_whole();
  use();
  z->release_whole();
}

}  // namespace lockstep
