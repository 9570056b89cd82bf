// ZeRO-3 parameter memory: each data-parallel rank holds only its shard of the parameters (the
// same shard as its AdamW moments and reduced gradient: DataParallel's ShardPlan), and each layer's
// tensors are all-gathered whole just before the layer runs, into one of two windows.
//
// The model (built with ModelOptions::sharded_params) asks through ParamStorage::gather before
// every layer's forward and backward (a backward walks the layers in reverse, so a layer's tensors
// are gathered twice a micro-batch: FSDP's re-gather in the backward; a recomputed forward uses
// the backward's gather). A layer whose tensors a window still holds is not gathered again — the
// last layer of a forward is the first of its backward, and the first layer's backward the next
// forward's start.
//
// Prefetch: the model names the layer it will ask for next; with a worker (threaded), its gather
// starts at once into the other window on a thread of its own, with its own duplicate of the dp
// group, and polls it to completion while the main thread computes — Open MPI's non-blocking
// collectives progress only inside MPI calls, so merely starting one would not overlap it (as
// grad_buckets.hpp's worker). Without one, each gather runs on the main thread when asked for.
//
// A gather is one all-gatherv per contiguous run of the layer's tensors in the flat buffer (a
// block's tensors are one run, or a few); every rank sends its shard's part of the run: fp32, or
// for the weights the layer's bf16 linears read (Model::layer_bf16_weights) bf16, rounded by the
// owner — half the bytes, the same bits as the model's rounding of the gathered fp32 (it is that
// rounding: the backend's round_to_bf16, of the whole shard once each time it changes, not in every
// gather) — and with bf16 parameters every tensor in bf16 (their values are bf16 already: nothing is
// lost). The gathered values are the parameters (or their bf16 roundings) bit for bit, so every pass
// computes what it computes on whole parameters, in either mode.
//
// Whatever writes the shard — the update (DataParallel::step), the initialisation, a checkpoint or
// a rollback — makes the windows and the shard's rounding stale: invalidate().
// Whole parameters, for what writes them outside the passes (initialisation from another model's
// file): hold_whole() all-gathers every shard into the model's whole buffer; release_whole()
// writes this rank's part of it back into the shard and frees it. What only reads them gathers the
// shards (DataParallel::gather_shards).
//
// Memory per rank: N/dp for the shard, plus two windows as large as the largest layer's tensors
// (bytes()) — instead of N.
//
// Not here: the gradient (ZeRO-2's storage: zero2_grads.hpp), the update (data_parallel.hpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/model/model.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/grad_buckets.hpp"

namespace lockstep::parallel {

class Zero3Params final : public ParamStorage {
 public:
  // model: built with sharded_params (this sets itself as its ParamStorage; the destructor unsets
  // it); plan: the dp shards of its flat buffer; threaded: gather ahead on a worker (collective
  // over dp: it duplicates the group either way).
  Zero3Params(Model& model, comm::Communicator& dp, const ShardPlan& plan, bool threaded);
  ~Zero3Params() override;
  Zero3Params(const Zero3Params&) = delete;
  Zero3Params& operator=(const Zero3Params&) = delete;

  // This rank's shard: elements [shard_first(), shard_end()) of the flat buffer.
  float* shard() { return shard_.data(); }
  int64_t shard_first() const { return first_; }
  int64_t shard_end() const { return first_ + static_cast<int64_t>(shard_.size()); }

  std::span<float* const> gather(size_t layer, size_t next) override;
  // The shard changed: no window holds current values (waits for a gather in flight), and the
  // shard's bf16 rounding is made again.
  void invalidate();

  void hold_whole();
  void release_whole();

  // Bytes of parameters a rank holds between whole-parameter uses: its shard, the two windows and,
  // where it gathers bf16, the shard's rounding and a run's gather buffer.
  uint64_t bytes() const;
  // The gathers since the last call: the time they took on the worker (or the main thread) and
  // the main thread's wait for them; their bytes are on the group's stats (absorb_into).
  OverlapStats take_stats();
  // Moves the gathers' byte counts onto `dp` (the trainer counts bytes there). Main thread, with
  // no gather in flight.
  void absorb_into(comm::Communicator& dp);

 private:
  // The tensors layer l reads, as runs of the flat buffer packed one after another in a window.
  struct Run {
    int64_t first = 0, end = 0, at = 0;  // flat [first, end) at window offset `at`
    bool bf16 = false;                   // gathered as bf16
  };
  struct LayerGather {
    std::vector<Run> runs;
    std::vector<int64_t> at;  // window offset of each of Model::layer_params(l)
  };
  struct Window {
    std::vector<float> data;
    std::vector<float*> where;
    size_t layer = SIZE_MAX;  // what it holds (or will, once ready)
    bool ready = true;        // false while a gather into it is in flight
  };
  // Fills window w with layer l's tensors (on the worker, or the main thread without one).
  void fill(Window& w, size_t layer);
  // Main thread: window w is to hold layer l; the worker fills it (or this thread at once).
  void assign(Window& w, size_t layer);
  void wait_ready(Window& w);
  void run_worker();

  Model& model_;
  std::unique_ptr<comm::Communicator> comm_;
  ShardPlan plan_;
  int64_t first_;
  std::vector<float> shard_;
  // The shard rounded to bf16, the bits this rank sends of a bf16 run (none where no run is bf16);
  // a bf16 run's gather (the worker's, or the main thread's without one).
  std::vector<uint16_t> shard_bf16_, bf16_;
  // The backend's rounding of a block of the shard, before its high halves go to shard_bf16_.
  std::vector<float> rounded_;
  std::vector<LayerGather> layers_;
  Window windows_[2];
  size_t current_ = 0;  // the window the model reads now

  double comm_s_ = 0, exposed_s_ = 0;
  int gathers_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  Window* job_ = nullptr;  // the window the worker is to fill next
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;  // last: started once the rest is constructed
};

}  // namespace lockstep::parallel
