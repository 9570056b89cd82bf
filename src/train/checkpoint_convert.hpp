// `lockstep ckpt convert`: a checkpoint rewritten offline as another layout would have saved it —
// each of that layout's ranks' shares (saved_pieces) in a data file of its own, the manifest's
// layout and the run state's layout and [parallel] section those of the target — so that a job of
// that layout resumes reading only its own files, and a layout the model cannot take is refused
// before any job starts. The tensors, the sampler, the observers' state and the model hash are the
// source's: resuming the converted checkpoint is bitwise resuming the original.
// Not here: resharding at load (any layout already loads any checkpoint: checkpointing.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "src/ckpt/checkpoint.hpp"

namespace lockstep {

struct ConvertedCheckpoint {
  std::string dir;      // the new checkpoint
  int64_t step = 0;
  int64_t files = 0;    // data files: one per rank of the target layout that holds something
  uint64_t bytes = 0;   // of every data file
  uint64_t largest = 0; // of the largest one
  std::string model_hash;
};

// Converts checkpoint `source` (loaded, so verified whole) to the layout `to_layout`
// ("dp=D,tp=T[,sp=true|false][,zero=Z][,ep=E]"; keys not given keep the source run's values) as a checkpoint
// of the same step under root `out_root`, which must not hold that step already. ConfigError for a
// malformed layout or one the model does not divide (naming it), DataError for a checkpoint that
// is not a training run's.
ConvertedCheckpoint convert_checkpoint(const ckpt::Checkpoint& source, const std::string& to_layout,
                                       const std::string& out_root);

}  // namespace lockstep
