// Checksums of the state at rest ([verify] state_at_rest): after each update every rank hashes
// (checksum.hpp) the state it holds between steps — its parameters and its AdamW moments (its shard under
// ZeRO) — and before the next step's forward hashes them again. A buffer that changed in between
// was corrupted in memory (class corruption): nothing the trainer runs writes to it there. Each
// rank judges its own buffers; one all-gather over the world of a bit per buffer lets every rank
// reach the same finding, which names the ranks and the buffer. The first step of a run (or of a
// resumed run) has nothing to compare with.
// Not here: replicas that differ across ranks (replicas.hpp), corruption inside a step (the GEMM
// and collective detectors to come).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

struct RestingBuffer {
  std::string name;             // "parameters", "optim/m", "optim/v"
  std::span<const float> data;  // this rank's
};

class StateAtRestDetector final : public StepObserver {
 public:
  StateAtRestDetector(std::vector<RestingBuffer> buffers, comm::Communicator& world, FindingLog& log,
                      FaultAction action);
  void after_update(int64_t step) override;  // hashes
  void begin_step(int64_t step) override;    // hashes again and compares
  void rolled_back(int64_t) override {  // the restored state is another one
    hashes_.clear();
    hashed_step_ = -1;
  }
  // The hash of buffer `name` taken after the update of `step` (none: not taken in that step), for
  // detectors that would hash the same bytes again (replicas.hpp).
  std::optional<uint64_t> hash_after_update(int64_t step, const std::string& name) const;

 private:
  std::vector<RestingBuffer> buffers_;
  comm::Communicator& world_;
  FindingLog& log_;
  FaultAction action_;
  std::vector<uint64_t> hashes_;  // after the last update; empty before the first
  int64_t hashed_step_ = -1;      // the step whose update hashes_ follows
};

}  // namespace lockstep::detect
