// safetensors export: the model's parameters in the format that PyTorch, JAX and Hugging Face tools
// read (https://huggingface.co/docs/safetensors), so that another framework can start from exactly
// Lockstep's parameters (scripts/compare_pytorch.sh does).
//
// Format, as the safetensors specification defines it:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object, UTF-8: for each tensor `"name": {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}` (byte offsets into the data section, end exclusive),
//             plus an optional "__metadata__" object of string values; padded with spaces so that
//             the data section starts at a multiple of 8 bytes
//   the data  each tensor's elements row-major, little-endian, back to back in the given order.
// Names are kept as Lockstep writes them ("wte", "layer/0/attn/qkv/weight", ...): the format allows
// any string, and a reader maps them to its own module names.
//
// Not here: reading safetensors back (import), dtypes without a safetensors name, sharded files.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/ckpt/checkpoint.hpp"

namespace lockstep::ckpt {

// The safetensors dtype name of `t` ("F32", "BF16", "F8_E4M3", ...); ConfigError for formats the
// specification has no name for (E8M0).
std::string safetensors_dtype(DType t);

// The whole file as bytes: header length, header, data. `metadata` goes to "__metadata__" (omitted
// when empty). ConfigError for an empty or repeated name, "__metadata__" as a name, or a dtype
// without a safetensors name.
std::string safetensors_bytes(const std::vector<TensorRef>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Writes safetensors_bytes(...) to `path` atomically (the path holds the old file or the complete
// new one, never a part). DataError naming the path on any I/O failure.
void save_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace lockstep::ckpt
