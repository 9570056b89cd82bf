#include "src/plan/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "src/core/check.hpp"
#include "src/train/toml_file.hpp"

namespace lockstep::plan {

double Cluster::peak(Precision p) const {
  return p == Precision::kFp8 ? peak_fp8 : p == Precision::kBf16 ? peak_bf16 : peak_fp32;
}

double Cluster::gemm_flops(Precision p) const { return peak(p) * gemm_efficiency; }

namespace {

// Section `name` of the file, every key of which must be read (unknown keys are errors).
class Reader {
 public:
  Reader(const std::string& path, const toml::table& root, const std::string& name) : path_(path), name_(name) {
    const toml::node* node = root.get(name);
    LS_REQUIRE(node != nullptr && node->is_table(), path, ": missing section [", name, "]");
    table_ = node->as_table();
  }

  double number(const std::string& key, double lo, double hi) {
    const toml::node* node = table_->get(key);
    LS_REQUIRE(node != nullptr, path_, ": [", name_, "] ", key, " is missing");
    const std::optional<double> v = node->value<double>();
    LS_REQUIRE(v.has_value(), path_, ": [", name_, "] ", key, " must be a number");
    LS_REQUIRE(*v >= lo && *v <= hi, path_, ": [", name_, "] ", key, " = ", *v, " must be in [", lo, ", ", hi, "]");
    read_.push_back(key);
    return *v;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    const double v = number(key, static_cast<double>(lo), static_cast<double>(hi));
    LS_REQUIRE(v == std::floor(v), path_, ": [", name_, "] ", key, " = ", v, " must be a whole number");
    return static_cast<int64_t>(v);
  }
  std::string text(const std::string& key) {
    const toml::node* node = table_->get(key);
    LS_REQUIRE(node != nullptr && node->is_string(), path_, ": [", name_, "] ", key, " is missing (a string)");
    read_.push_back(key);
    return std::string(*node->value<std::string>());
  }
  void finish() const {
    for (const auto& [key, node] : *table_) {
      const std::string k(key.str());
      LS_REQUIRE(std::find(read_.begin(), read_.end(), k) != read_.end(), path_, ": [", name_, "] ", k,
                 " is not a cluster field");
    }
  }

 private:
  std::string path_, name_;
  const toml::table* table_ = nullptr;
  std::vector<std::string> read_;
};

Link read_link(const std::string& path, const toml::table& root, const std::string& name) {
  Reader r(path, root, name);
  Link l{r.number("bandwidth_gbs", 1e-3, 1e6) * 1e9, r.number("latency_us", 0, 1e6) * 1e-6};
  r.finish();
  return l;
}

}  // namespace

Cluster load_cluster(const std::string& path) {
  const toml::table root = parse_toml_file(path);
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    LS_REQUIRE(k == "cluster" || k == "peak_tflops" || k == "efficiency" || k == "intra_node" || k == "inter_node" ||
                   k == "reliability" || k == "storage",
               path, ": [", k,
               "] is not a cluster section (expected cluster, peak_tflops, efficiency, intra_node, inter_node, "
               "reliability, storage)");
  }
  Cluster c;
  c.source = path;
  Reader g(path, root, "cluster");
  c.name = g.text("name");
  c.gpus_per_node = g.integer("gpus_per_node", 1, 1024);
  c.nodes = g.integer("nodes", 1, 1 << 20);
  c.hbm_bytes = g.number("hbm_gib", 1e-3, 1e6) * (1 << 30);
  c.reserved_bytes = g.number("reserved_gib", 0, 1e6) * (1 << 30);
  const double hbm_bandwidth = g.number("hbm_gbs", 1e-3, 1e9) * 1e9;
  g.finish();
  LS_REQUIRE(c.reserved_bytes < c.hbm_bytes, path, ": [cluster] reserved_gib must be below hbm_gib");
  Reader p(path, root, "peak_tflops");
  c.peak_fp32 = p.number("fp32", 0, 1e6) * 1e12;
  c.peak_bf16 = p.number("bf16", 0, 1e6) * 1e12;
  c.peak_fp8 = p.number("fp8", 0, 1e6) * 1e12;
  p.finish();
  LS_REQUIRE(c.peak_fp32 > 0 || c.peak_bf16 > 0 || c.peak_fp8 > 0, path, ": [peak_tflops] every precision is 0");
  Reader e(path, root, "efficiency");
  c.gemm_efficiency = e.number("gemm", 1e-3, 1);
  c.stream_bandwidth = hbm_bandwidth * e.number("memory", 1e-3, 1);
  e.finish();
  c.intra = read_link(path, root, "intra_node");
  c.inter = read_link(path, root, "inter_node");
  Reader r(path, root, "reliability");
  c.mtbf_gpu_hours = r.number("mtbf_gpu_hours", 1e-3, 1e12);
  c.restart_s = r.number("restart_s", 0, 1e9);
  r.finish();
  Reader s(path, root, "storage");
  c.storage_write = s.number("write_gbs", 1e-3, 1e9) * 1e9;
  s.finish();
  return c;
}

}  // namespace lockstep::plan
