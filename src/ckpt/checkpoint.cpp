// Parts of the checkpoint API shared by save and load: names, sizes, the model hash, and access to
// a loaded checkpoint's tensors. The file format itself is described in checkpoint.hpp.
#include "src/ckpt/checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <regex>

#include "src/core/check.hpp"
#include "src/core/hash.hpp"

namespace lockstep::ckpt {
namespace {

// The hash's integers are little-endian by definition; tensor bytes are hashed as they lie in
// memory, which is the same little-endian order only on little-endian hosts.
static_assert(std::endian::native == std::endian::little,
              "checkpoints store and hash little-endian data; big-endian hosts are not supported");

void hash_u64(Hasher& h, uint64_t v) { h.update(&v, sizeof v); }

void hash_parameter(Hasher& h, const std::string& name, DType dtype,
                    const std::vector<int64_t>& shape, const void* data, uint64_t bytes) {
  hash_u64(h, name.size());
  h.update(name.data(), name.size());
  std::string_view dname = dtype_name(dtype);
  hash_u64(h, dname.size());
  h.update(dname.data(), dname.size());
  hash_u64(h, shape.size());
  for (int64_t d : shape) hash_u64(h, static_cast<uint64_t>(d));
  hash_u64(h, bytes);
  h.update(data, bytes);
}

bool is_parameter(const std::string& name) { return name.rfind(kModelPrefix, 0) == 0; }

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t step_of_dir_name(const std::string& name) {
  static const std::regex kStepDir("step_([0-9]{1,18})");
  std::smatch match;
  if (!std::regex_match(name, match, kStepDir)) return -1;
  return std::stoll(match[1].str());
}


int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<PlaceRun> place_runs(const std::vector<int64_t>& shape, const ShardPlace& p, std::string* invalid) {
  std::vector<PlaceRun> runs;
  const int64_t total = numel(shape);
  if (p.split_dim < 0) {
    if (p.first < 0 || p.first > p.end || p.end > total) {
      *invalid = str_cat("elements [", p.first, ", ", p.end, ") outside the tensor's ", total);
      return {};
    }
    if (p.end > p.first) runs.push_back({0, p.first, p.end - p.first});
    return runs;
  }
  if (p.split_dim >= static_cast<int>(shape.size())) {
    *invalid = str_cat("split_dim ", p.split_dim, " is not a dim of the ", shape.size(), "-dim tensor");
    return {};
  }
  const auto d = static_cast<size_t>(p.split_dim);
  int64_t outer = 1, inner = 1, along = 0;
  for (size_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<int64_t> starts;  // local index along d where each range begins
  for (const auto& [first, end] : p.ranges) {
    if (first < 0 || first > end || end > shape[d]) {
      *invalid = str_cat("range [", first, ", ", end, ") outside dim ", d, " (", shape[d], ")");
      return {};
    }
    starts.push_back(along);
    along += end - first;
  }
  if (p.first < 0 || p.first > p.end || p.end > outer * along * inner) {
    *invalid = str_cat("elements [", p.first, ", ", p.end, ") outside its slices' ", outer * along * inner);
    return {};
  }
  for (int64_t i = p.first; i < p.end;) {
    const int64_t o = i / (along * inner), l = i / inner % along, j = i % inner;
    const size_t r = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), l) - starts.begin()) - 1;
    const int64_t in_range = l - starts[r];
    const int64_t count = std::min((p.ranges[r].second - p.ranges[r].first - in_range) * inner - j, p.end - i);
    runs.push_back({i - p.first, (o * shape[d] + p.ranges[r].first + in_range) * inner + j, count});
    i += count;
  }
  return runs;
}

std::string coverage_problem(std::vector<std::pair<int64_t, int64_t>>& covered, int64_t numel, const std::string& part) {
  std::sort(covered.begin(), covered.end());
  int64_t next = 0;
  for (const auto& [first, end] : covered) {
    if (first < next) return str_cat("element ", first, " is in two ", part, "s");
    if (first > next) return str_cat("elements [", next, ", ", first, ") are in no ", part);
    next = end;
  }
  if (next != numel) return str_cat("elements [", next, ", ", numel, ") are in no ", part);
  return "";
}

void ModelHasher::add(const TensorRef& t) {
  if (!is_parameter(t.name)) return;
  const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
  hash_parameter(hasher_, t.name, t.dtype, t.shape, t.data, bytes);
}

uint64_t ModelHasher::digest() const { return hasher_.digest(); }

uint64_t model_hash(const std::vector<TensorRef>& tensors) {
  ModelHasher h;
  for (const TensorRef& t : tensors) h.add(t);
  return h.digest();
}

uint64_t model_hash(const Checkpoint& ckpt) {
  Hasher h;
  for (const StoredTensor& t : ckpt.tensors) {
    if (!is_parameter(t.name)) continue;
    hash_parameter(h, t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  }
  return h.digest();
}

bool Checkpoint::has(const std::string& name) const {
  for (const StoredTensor& t : tensors) {
    if (t.name == name) return true;
  }
  return false;
}

const StoredTensor& Checkpoint::tensor(const std::string& name) const {
  for (const StoredTensor& t : tensors) {
    if (t.name == name) return t;
  }
  throw DataError(str_cat("checkpoint ", dir, " has no tensor '", name, "' (it has ",
                          tensors.size(), " tensors)"));
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors.size());
  for (const StoredTensor& t : tensors) out.push_back(t.name);
  return out;
}

void Checkpoint::copy_to(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                         void* dst) const {
  const StoredTensor& t = tensor(name);
  if (t.dtype != dtype || t.shape != shape) {
    throw DataError(str_cat("checkpoint ", dir, ": tensor '", name, "' is ", dtype_name(t.dtype),
                            " ", shape_text(t.shape), ", expected ", dtype_name(dtype), " ",
                            shape_text(shape)));
  }
  std::memcpy(dst, t.bytes.data(), t.bytes.size());
}

}  // namespace lockstep::ckpt
