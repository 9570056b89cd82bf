// [train] init_from: a run that starts (no checkpoint to resume) takes its initial parameters from a
// safetensors file instead of its seed — one `lockstep ckpt export` wrote (Lockstep's names), or a
// GPT-2-style model saved by Hugging Face transformers (their names, Conv1D matrices transposed:
// src/ckpt/safetensors.hpp's hf_gpt2_name). F32, BF16 and F16 tensors are read, the latter two
// widened exactly. Every parameter of the model must be in the file with its shape; a tensor of
// the file the model has no use for is named on the start-up line, not an error (GPT-2 files carry
// attention masks, and a tied model ignores lm_head.weight). With bf16 parameters
// ([train] master_weights = false) the values are rounded to bf16 as the seed's would be.
// Not here: writing such files (`lockstep ckpt export`), optimizer state (AdamW starts at zero).
#pragma once

#include <string>

#include "src/train/run.hpp"

namespace lockstep {

// Loads `path` into the run's parameters (this rank's slices); returns the start-up line's text.
// DataError naming the file and the tensor for a missing parameter, a shape or dtype that does not
// fit, or a file that is not safetensors.
std::string init_parameters_from(TrainRun& run, const std::string& path);

}  // namespace lockstep
