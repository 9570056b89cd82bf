#include "src/ckpt/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"

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
    case DType::kU64: return "U64";
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

std::vector<StoredTensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  durable_io::ReadFile file(path);
  const uint64_t size = file.size();
  if (size < 8) throw DataError(str_cat(path, ": ", size, " bytes, too short for a safetensors file"));
  unsigned char len_bytes[8];
  file.read_at(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > size - 8) throw DataError(str_cat(path, ": header length ", n, " runs past the file (", size, " bytes)"));
  std::string text(static_cast<size_t>(n), '\0');
  file.read_at(8, text.data(), text.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(path, ": header is not JSON: ", e.what()));
  }
  if (!header.is_object()) throw DataError(str_cat(path, ": header is not a JSON object"));
  const uint64_t data_start = 8 + n, data_bytes = size - data_start;
  std::vector<StoredTensor> out;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata != nullptr && entry.is_object()) {
        for (const auto& [k, v] : entry.items()) (*metadata)[k] = v.is_string() ? v.get<std::string>() : v.dump();
      }
      continue;
    }
    const auto bad = [&](const std::string& why) { return DataError(str_cat(path, ": tensor '", name, "': ", why)); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw bad("expected {\"dtype\", \"shape\", \"data_offsets\"}");
    }
    StoredTensor t;
    t.name = name;
    const std::string dtype = entry["dtype"].is_string() ? entry["dtype"].get<std::string>() : "";
    bool known = false;
    for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2, DType::kI32,
                    DType::kI64, DType::kU8, DType::kU16}) {
      if (safetensors_dtype(d) == dtype) {
        t.dtype = d;
        known = true;
      }
    }
    if (!known) throw bad(str_cat("unknown dtype '", entry["dtype"].dump(), "'"));
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad("shape must hold non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw bad("data_offsets must be [begin, end]");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    const uint64_t want = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    if (end < begin || end - begin != want) throw bad(str_cat("data_offsets [", begin, ", ", end, ") hold ", end - begin,
                                                              " bytes, its dtype and shape need ", want));
    if (end > data_bytes) throw bad(str_cat("data_offsets end ", end, " runs past the data (", data_bytes, " bytes)"));
    spans.emplace_back(begin, end);
    t.bytes.resize(static_cast<size_t>(want));
    file.read_at(data_start + begin, t.bytes.data(), t.bytes.size());
    t.xxh64 = xxh64(t.bytes.data(), t.bytes.size());
    out.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) throw DataError(str_cat(path, ": two tensors' data_offsets overlap"));
  }
  return out;
}

ImportedName hf_gpt2_name(const std::string& hf) {
  static const std::regex kLayer(R"(^h\.(\d+)\.(.+)$)");
  std::string name = hf.rfind("transformer.", 0) == 0 ? hf.substr(12) : hf;
  if (name == "wte.weight") return {"wte"};
  if (name == "wpe.weight") return {"wpe"};
  if (name == "ln_f.weight") return {"lnf/weight"};
  if (name == "ln_f.bias") return {"lnf/bias"};
  if (name == "lm_head.weight") return {"lm_head/weight"};  // nn.Linear: (vocab, C) as Lockstep's
  std::smatch m;
  if (!std::regex_match(name, m, kLayer)) return {};
  const std::string layer = "layer/" + m[1].str() + "/";
  static const std::map<std::string, ImportedName> kParts = {
      {"ln_1.weight", {"ln1/weight"}},          {"ln_1.bias", {"ln1/bias"}},
      {"ln_2.weight", {"ln2/weight"}},          {"ln_2.bias", {"ln2/bias"}},
      {"attn.c_attn.weight", {"attn/qkv/weight", true}}, {"attn.c_attn.bias", {"attn/qkv/bias"}},
      {"attn.c_proj.weight", {"attn/proj/weight", true}}, {"attn.c_proj.bias", {"attn/proj/bias"}},
      {"mlp.c_fc.weight", {"mlp/fc/weight", true}},     {"mlp.c_fc.bias", {"mlp/fc/bias"}},
      {"mlp.c_proj.weight", {"mlp/proj/weight", true}}, {"mlp.c_proj.bias", {"mlp/proj/bias"}}};
  const auto it = kParts.find(m[2].str());
  if (it == kParts.end()) return {};
  return {layer + it->second.name, it->second.transposed};
}

void save_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  durable_io::write_file_atomic(path, safetensors_bytes(tensors, metadata));
}

}  // namespace lockstep::ckpt
