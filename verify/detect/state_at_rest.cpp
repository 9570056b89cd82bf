#include "verify/detect/state_at_rest.hpp"

#include "src/core/check.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/checksum.hpp"

namespace lockstep::detect {

namespace {

uint64_t hash_of(const RestingBuffer& b) { return block_hash(b.data.data(), b.data.size_bytes()); }

}  // namespace

StateAtRestDetector::StateAtRestDetector(std::vector<RestingBuffer> buffers, comm::Communicator& world,
                                         FindingLog& log, FaultAction action)
    : buffers_(std::move(buffers)), world_(world), log_(log), action_(action) {
  LS_CHECK(buffers_.size() <= 64, "a bit per buffer in one word");
}

void StateAtRestDetector::after_update(int64_t step) {
  hashes_.resize(buffers_.size());
  for (size_t i = 0; i < buffers_.size(); ++i) hashes_[i] = hash_of(buffers_[i]);
  hashed_step_ = step;
}

std::optional<uint64_t> StateAtRestDetector::hash_after_update(int64_t step, const std::string& name) const {
  if (step != hashed_step_) return std::nullopt;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].name == name) return hashes_[i];
  }
  return std::nullopt;
}

void StateAtRestDetector::begin_step(int64_t step) {
  if (hashes_.empty()) return;
  uint64_t changed = 0;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (hash_of(buffers_[i]) != hashes_[i]) changed |= uint64_t{1} << i;
  }
  const std::vector<uint64_t> all = agreed_all_gather(world_, std::span<const uint64_t>(&changed, 1));
  for (size_t i = 0; i < buffers_.size(); ++i) {
    std::vector<int> ranks;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r] >> i & 1) ranks.push_back(static_cast<int>(r));
    }
    if (ranks.empty()) continue;
    log_.report({.step = step, .ranks = ranks, .detector = "state_at_rest", .site = buffers_[i].name,
                 .magnitude = static_cast<double>(ranks.size()), .bound = 0, .unit = "ranks",
                 .classification = "corruption",
                 .detail = str_cat("its hash after the update of step ", step,
                                   " differs from the one before this step's forward: changed in memory between steps")},
                action_, kExitCorruption, "on_fault");
  }
}

}  // namespace lockstep::detect
