#include "src/ckpt/safetensors.hpp"

#include <bit>
#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"

namespace lockstep::ckpt {

// safetensors data is little-endian; the writer copies elements as they lie in memory.
static_assert(std::endian::native == std::endian::little, "safetensors export assumes a little-endian host");

std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kE4M3: return "F8_E4M3";
    case DType::kE5M2: return "F8_E5M2";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kU16: return "U16";
    case DType::kE8M0: break;
  }
  throw ConfigError(str_cat("safetensors has no dtype for ", dtype_name(t)));
}

std::string safetensors_bytes(const std::vector<TensorRef>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // nlohmann::ordered_json keeps the tensors in the caller's order, which is also the data order,
  // so the header reads in the same order as the bytes it describes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    LS_REQUIRE(!t.name.empty(), "safetensors: a tensor has an empty name");
    LS_REQUIRE(t.name != "__metadata__", "safetensors: '__metadata__' is reserved, not a tensor name");
    LS_REQUIRE(seen.insert(t.name).second, "safetensors: tensor name '", t.name, "' appears twice");
    const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  for (const auto& t : tensors) {
    const auto bytes = static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype);
    out.append(static_cast<const char*>(t.data), bytes);
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  durable_io::write_file_atomic(path, safetensors_bytes(tensors, metadata));
}

}  // namespace lockstep::ckpt
