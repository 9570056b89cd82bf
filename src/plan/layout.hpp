// A parallel layout as the planner searches them: the trainer's axes and knobs (docs/usage.md,
// [parallel] and [train]) for one job. Text form, as printed and as `--explain` takes it:
//   "dp16 tp8 pp8 mb1 zero1 sp 1f1b recompute=selective"   (sp, the schedule and recompute optional;
//   interleaved schedules as "interleaved:V"; after ppN, "cpN" for context parallelism and "epN"
//   for a MoE model's expert parallelism, each only when above 1)
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "src/model/layer.hpp"
#include "src/parallel/pipeline_schedule.hpp"

namespace lockstep::plan {

// The micro-batch sizes (sequences) the search tries, and the local cluster's profile times.
inline constexpr int64_t kSearchedMicroBatches[] = {1, 2, 4, 8, 16};
// The stages a pipeline rank holds in the searched interleaved layouts (Megatron-LM's usual two).
inline constexpr int64_t kSearchedChunks = 2;
// The pipeline schedules the search tries, with the stages a rank holds in each.
inline constexpr std::pair<parallel::ScheduleKind, int64_t> kSearchedSchedules[] = {
    {parallel::ScheduleKind::kOneFOneB, 1},
    {parallel::ScheduleKind::kZeroBubble, 1},
    {parallel::ScheduleKind::kInterleaved, kSearchedChunks}};

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t cp = 1;  // context parallelism: each sequence's positions over cp ranks; dp x cp replicas
  bool ring = false;  // cp's keys and values over the ring ([parallel] cp_comm = "p2p"): blockwise attention
  int64_t ep = 1;  // expert parallelism: the data ranks are dp x ep
  int64_t chunks = 1;  // virtual stages a pipeline rank holds (interleaved)
  int64_t micro_batch = 1;  // sequences per micro-batch
  int zero = 0;
  bool sp = false;
  Recompute recompute = Recompute::kNone;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::kOneFOneB;

  int64_t gpus() const { return dp * tp * pp * cp * ep; }
  std::string text() const;
};

// ConfigError naming `where` and the token it does not understand.
Layout parse_layout(const std::string& text, const std::string& where);

}  // namespace lockstep::plan
