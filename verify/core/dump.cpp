// Reading tensor dumps (dump.hpp): the manifest and its .npy files, every field checked.
// Not here: writing (header-only in dump.hpp) and comparing (diff.cpp).
#include "verify/core/dump.hpp"

#include <cstring>

namespace lockstep::verify {

namespace {

// The value of `'key': ` in a numpy header dict, up to the next ',' outside parentheses.
std::string header_field(const std::string& dict, const std::string& key, const std::string& path) {
  const std::string needle = "'" + key + "':";
  const size_t at = dict.find(needle);
  if (at == std::string::npos) throw DataError(str_cat(path, ": npy header lacks '", key, "': ", dict));
  size_t i = at + needle.size();
  while (i < dict.size() && dict[i] == ' ') ++i;
  int depth = 0;
  size_t end = i;
  for (; end < dict.size(); ++end) {
    if (dict[end] == '(') ++depth;
    if (dict[end] == ')') --depth;
    if ((dict[end] == ',' || dict[end] == '}') && depth == 0) break;
  }
  return dict.substr(i, end - i);
}

}  // namespace

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>& shape) {
  durable_io::ReadFile f(path);  // DataError naming the path if it cannot be opened
  char pre[10];
  f.read_at(0, pre, sizeof pre);
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) throw DataError(str_cat(path, ": not a .npy file (bad magic)"));
  if (pre[6] != 1 || pre[7] != 0) {
    throw DataError(str_cat(path, ": npy format version ", int(pre[6]), ".", int(pre[7]),
                            " (expected 1.0, as lockstep writes)"));
  }
  const size_t hlen = static_cast<unsigned char>(pre[8]) | (static_cast<size_t>(static_cast<unsigned char>(pre[9])) << 8);
  std::string dict(hlen, '\0');
  f.read_at(10, dict.data(), hlen);
  const std::string descr = header_field(dict, "descr", path);
  if (descr != "'<f4'") throw DataError(str_cat(path, ": npy dtype ", descr, " (expected '<f4')"));
  if (header_field(dict, "fortran_order", path) != "False") {
    throw DataError(str_cat(path, ": npy array is in Fortran order (expected C order)"));
  }
  const std::string tuple = header_field(dict, "shape", path);
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') {
    throw DataError(str_cat(path, ": npy shape ", tuple, " is not a tuple"));
  }
  shape.clear();
  int64_t n = 1;
  size_t i = 1;
  while (i < tuple.size() - 1) {
    while (i < tuple.size() - 1 && (tuple[i] == ' ' || tuple[i] == ',')) ++i;
    if (i >= tuple.size() - 1) break;
    size_t j = i;
    while (j < tuple.size() - 1 && tuple[j] >= '0' && tuple[j] <= '9') ++j;
    if (j == i) throw DataError(str_cat(path, ": npy shape ", tuple, " is not a tuple of integers"));
    shape.push_back(std::stoll(tuple.substr(i, j - i)));
    n *= shape.back();
    i = j;
  }
  const uint64_t want = 10 + hlen + static_cast<uint64_t>(n) * sizeof(float);
  if (f.size() != want) {
    throw DataError(str_cat(path, ": ", f.size(), " bytes, expected ", want, " for shape ", tuple,
                            (f.size() < want ? " (truncated)" : " (trailing bytes)")));
  }
  std::vector<float> data(static_cast<size_t>(n));
  f.read_at(10 + hlen, data.data(), data.size() * sizeof(float));
  return data;
}

Dump read_dump(const std::string& dir) {
  Dump d;
  d.dir = dir;
  const std::string path = dir + "/manifest.json";
  if (!durable_io::exists(path)) {
    throw DataError(str_cat(path, ": no such file (is ", dir, " a dump directory written by --dump.dir?)"));
  }
  try {
    d.manifest = nlohmann::json::parse(durable_io::read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(path, ": not valid JSON: ", e.what()));
  }
  try {
    const auto& m = d.manifest;
    if (m.at("format") != kDumpFormat || m.at("version") != kDumpVersion) {
      throw DataError(str_cat(path, ": format ", m.at("format").dump(), " version ", m.at("version").dump(),
                              " (expected \"", kDumpFormat, "\" version ", kDumpVersion,
                              "; re-run the training with --dump.dir to write it again)"));
    }
    for (const auto& t : m.at("tensors")) {
      d.entries.push_back({t.at("name").get<std::string>(), t.at("step").get<int64_t>(),
                           t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
                           t.at("file").get<std::string>(), t.at("xxh64").get<std::string>()});
      if (d.entries.back().dtype != "float32") {
        throw DataError(str_cat(path, ": tensor ", d.entries.back().name, " has dtype ", d.entries.back().dtype,
                                " (this lockstep reads float32 dumps)"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(path, ": malformed manifest: ", e.what()));
  }
  return d;
}

std::vector<float> load_entry(const Dump& dump, const DumpEntry& e) {
  const std::string path = dump.dir + "/" + e.file;
  std::vector<int64_t> shape;
  std::vector<float> data = read_npy_f32(path, shape);
  if (shape != e.shape) {
    throw DataError(str_cat(path, ": shape ", nlohmann::json(shape).dump(), " but the manifest says ",
                            nlohmann::json(e.shape).dump(), " for ", e.name));
  }
  const std::string h = hex64(xxh64(data.data(), data.size() * sizeof(float)));
  if (h != e.xxh64) {
    throw DataError(str_cat(path, ": payload xxh64 ", h, " but the manifest says ", e.xxh64, " for ", e.name,
                            " (the file was changed after the dump was written)"));
  }
  return data;
}

}  // namespace lockstep::verify
