// Parts of the checkpoint API shared by save and load: names, sizes, the model hash, and access to
// a loaded checkpoint's tensors. The file format itself is described in checkpoint.hpp.
#include "src/ckpt/checkpoint.hpp"

#include <bit>
#include <cstdio>
#include <cstring>

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

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

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

uint64_t model_hash(const std::vector<TensorRef>& tensors) {
  Hasher h;
  for (const TensorRef& t : tensors) {
    if (!is_parameter(t.name)) continue;
    uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    hash_parameter(h, t.name, t.dtype, t.shape, t.data, bytes);
  }
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
                            " ", shape_str(t.shape), ", expected ", dtype_name(dtype), " ",
                            shape_str(shape)));
  }
  std::memcpy(dst, t.bytes.data(), t.bytes.size());
}

}  // namespace lockstep::ckpt
