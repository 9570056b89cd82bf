// safetensors export and import: the model's parameters in the format that PyTorch, JAX and Hugging
// Face tools read (https://huggingface.co/docs/safetensors), so that another framework can start
// from exactly Lockstep's parameters (scripts/compare_pytorch.sh does), and a Lockstep run from
// another's ([train] init_from).
//
// Format, as the safetensors specification defines it:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object, UTF-8: for each tensor `"name": {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}` (byte offsets into the data section, end exclusive),
//             plus an optional "__metadata__" object of string values; padded with spaces so that
//             the data section starts at a multiple of 8 bytes
//   the data  each tensor's elements row-major, little-endian, back to back in the given order.
// Names are kept as Lockstep writes them ("wte", "layer/0/attn/qkv/weight", ...): the format allows
// any string, and a reader maps them to its own module names. On import, Hugging Face's GPT-2 names
// are read too (hf_gpt2_name below).
//
// Not here: dtypes without a safetensors name, sharded files (model-00001-of-00002.safetensors).
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

// The tensors of a safetensors file, whole, with its "__metadata__" in *metadata (when given).
// DataError naming the file — and the tensor — for a header that does not parse or describe the
// data (a length past the file, an unknown dtype, offsets that do not match the shape or overlap).
std::vector<StoredTensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata);

// A Hugging Face GPT-2 parameter name ("h.3.attn.c_attn.weight", with or without "transformer.")
// as Lockstep's ("layer/3/attn/qkv/weight"), and whether its matrix is stored transposed (GPT-2's
// Conv1D keeps (in, out) where Lockstep's linears keep (out, in)); "" for a name with no Lockstep
// counterpart (attn.bias masks).
struct ImportedName {
  std::string name;
  bool transposed = false;
};
ImportedName hf_gpt2_name(const std::string& hf);

}  // namespace lockstep::ckpt
