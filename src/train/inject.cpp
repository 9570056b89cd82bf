#include "src/train/inject.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/formats.hpp"

namespace lockstep {

namespace {

// "key=value,key=value" after the kind's colon.
int64_t option(std::string_view opts, std::string_view key, int64_t fallback, const std::string& where) {
  while (!opts.empty()) {
    const size_t comma = opts.find(',');
    const std::string_view item = opts.substr(0, comma);
    const size_t eq = item.find('=');
    LS_REQUIRE(eq != std::string_view::npos, where, ": [inject] kind: expected key=value, got \"", item, "\"");
    if (item.substr(0, eq) == key) {
      int64_t v = 0;
      const std::string_view text = item.substr(eq + 1);
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      LS_REQUIRE(ec == std::errc() && end == text.data() + text.size(), where, ": [inject] kind: ", key,
                 " expects an integer, got \"", text, "\"");
      return v;
    }
    const std::string_view k = item.substr(0, eq);
    LS_REQUIRE(k == "bit" || k == "index" || k == "nth" || k == "ms" || k == "channel" || k == "growth" || k == "power",
               where, ": [inject] kind: unknown option \"", k, "\" (known: bit, index, nth, ms, channel, growth, power)");
    opts = comma == std::string_view::npos ? std::string_view() : opts.substr(comma + 1);
  }
  return fallback;
}

// A decimal option ("growth=1.5"); fallback when absent.
double decimal_option(std::string_view opts, std::string_view key, double fallback, const std::string& where) {
  for (std::string_view rest = opts; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (item.starts_with(key) && item.size() > key.size() && item[key.size()] == '=') {
      const std::string text(item.substr(key.size() + 1));
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      LS_REQUIRE(!text.empty() && end == text.c_str() + text.size(), where, ": [inject] kind: ", key,
                 " expects a number, got \"", text, "\"");
      return v;
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return fallback;
}

float round_through(const std::string& format, float x) {
  if (format == "bf16") return bf16_to_f32(bf16_from_f32(x));
  if (format == "f16") return f16_to_f32(f16_from_f32(x));
  if (format == "e4m3") return e4m3_to_f32(e4m3_from_f32(x, Saturation::kSaturate));
  return e5m2_to_f32(e5m2_from_f32(x, Saturation::kSaturate));
}

}  // namespace

Injection parse_injection(const InjectConfig& c, const std::string& where, const ModelConfig& model) {
  Injection inj;
  if (c.kind.empty() && c.site.empty()) return inj;
  LS_REQUIRE(!c.kind.empty(), where, ": [inject] needs a kind (bitflip:bit=B, order, cast:FORMAT, exit or hang)");
  LS_REQUIRE(c.step >= 0, where, ": [inject] step (", c.step, ") must be >= 0");
  LS_REQUIRE(c.rank >= -1, where, ": [inject] rank (", c.rank, ") must be a world rank or -1 (every rank)");
  inj.site = c.site;
  inj.step = c.step;
  inj.rank = c.rank;
  inj.persistent = c.persistent;
  const std::string_view kind = c.kind;
  const size_t colon = kind.find(':');
  const std::string_view head = kind.substr(0, colon);
  const std::string_view opts = colon == std::string_view::npos ? std::string_view() : kind.substr(colon + 1);
  if (head == "slow") {
    LS_REQUIRE(opts.starts_with("ms=") && c.site.empty(), where,
               ": [inject] kind slow takes ms=N (the milliseconds a step is slowed by) and no site");
    inj.kind = Injection::Kind::kSlow;
    inj.ms = option(opts, "ms", -1, where);
    LS_REQUIRE(inj.ms >= 0, where, ": [inject] kind slow: ms=N with N >= 0 is required");
    return inj;
  }
  if (head == "exit" || head == "hang") {
    LS_REQUIRE(opts.empty() && c.site.empty(), where, ": [inject] kind ", head,
               " takes no options and no site (the whole process ", head == "exit" ? "ends" : "hangs", ")");
    inj.kind = head == "exit" ? Injection::Kind::kExit : Injection::Kind::kHang;
    return inj;
  }
  LS_REQUIRE(!c.site.empty(), where, ": [inject] kind ", head,
             " needs a site (a tensor name such as layer/1/attn/att, param/NAME, optim/m or optim/v)");
  if (c.site.starts_with("param/")) {
    const std::string name = c.site.substr(6);
    bool found = false;
    for (const auto& t : build_param_layout(model)) found = found || t.name == name;
    LS_REQUIRE(found, where, ": [inject] site ", c.site, ": the model has no parameter ", name,
               " (names as `lockstep ckpt info` lists them without model/, e.g. param/lnf/weight)");
  }
  LS_REQUIRE(!is_state_site(c.site) || head == "bitflip" || head == "cast", where, ": [inject] site ", c.site,
             " (state at rest) takes kind bitflip or cast");
  if (is_gemm_site(c.site)) {
    LS_REQUIRE(head == "bitflip", where, ": [inject] site ", c.site, " (a GEMM product) takes kind bitflip");
    const size_t cut = c.site.rfind('/');
    const std::string weight = c.site.substr(5, cut - 5), product = c.site.substr(cut + 1);
    bool found = false;
    for (const auto& t : build_param_layout(model)) found = found || (t.name == weight && t.shape.size() == 2);
    LS_REQUIRE(found && (product == "forward" || product == "dinp" || product == "dweight"), where,
               ": [inject] site ", c.site, ": expected gemm/WEIGHT/forward|dinp|dweight with WEIGHT a matrix ",
               "parameter of the model (e.g. gemm/layer/0/mlp/fc/weight/forward; the tied head is gemm/wte/...)");
  }
  LS_REQUIRE(c.site != "optim/grad" || head == "bitflip", where, ": [inject] site optim/grad (the reduced gradient) ",
             "takes kind bitflip");
  if (is_checkpoint_site(c.site)) {
    LS_REQUIRE(c.site == "ckpt/manifest" || c.site == "ckpt/tensors", where, ": [inject] site ", c.site,
               ": expected ckpt/manifest (manifest.json) or ckpt/tensors (tensors-00000.bin)");
    LS_REQUIRE(head == "bitflip", where, ": [inject] site ", c.site, " (a checkpoint file) takes kind bitflip");
    LS_REQUIRE(c.rank <= 0, where, ": [inject] site ", c.site, ": checkpoints are written by world rank 0, not rank ",
               c.rank);
  }
  LS_REQUIRE(is_fp8_site(c.site) == (head == "fp8_scale"), where, ": [inject] kind fp8_scale goes with a site ",
             "fp8/LINEAR/ROLE (the scale of one fp8 tensor, e.g. fp8/layer/0/mlp/fc/input), and such a site with it");
  LS_REQUIRE((head != "outlier" && head != "spread") || (!is_state_site(c.site) && !is_gemm_site(c.site) &&
                                                         !is_comm_site(c.site) && !is_checkpoint_site(c.site) &&
                                                         c.site != "optim/grad"),
             where, ": [inject] kind ", head, " acts on a tensor of the step (a hook name), not ", c.site);
  if (is_comm_site(c.site)) {
    const size_t cut = c.site.find('/', 5);
    const std::string group = c.site.substr(5, cut == std::string::npos ? std::string::npos : cut - 5);
    const std::string op = cut == std::string::npos ? "" : c.site.substr(cut + 1);
    LS_REQUIRE(((group == "dp" || group == "tp" || group == "cp") &&
                (op == "all_reduce" || op == "reduce_scatter" || op == "all_gatherv" || op == "all_to_allv" ||
                 op == "broadcast")) ||
                   (group == "pp" && op == "send/recv"),
               where, ": [inject] site ", c.site, ": expected comm/GROUP/OP with GROUP dp, tp or cp and OP all_reduce, ",
               "reduce_scatter, all_gatherv, all_to_allv or broadcast, or comm/pp/send/recv (the received buffer of ",
               "that group's operation; pp: a pipeline stage's activation or gradient)");
    LS_REQUIRE(head == "bitflip", where, ": [inject] site ", c.site, " (a received message) takes kind bitflip");
  }
  if (head == "bitflip") {
    inj.kind = Injection::Kind::kBitflip;
    const int64_t bit = option(opts, "bit", -1, where);
    LS_REQUIRE(bit >= 0 && bit < 32, where, ": [inject] kind bitflip: bit=B with 0 <= B < 32 is required");
    inj.bit = static_cast<int>(bit);
    inj.index = option(opts, "index", 0, where);
    LS_REQUIRE(inj.index >= 0, where, ": [inject] kind bitflip: index must be >= 0");
    inj.nth = option(opts, "nth", 0, where);
    LS_REQUIRE(inj.nth >= 0, where, ": [inject] kind bitflip: nth must be >= 0");
    LS_REQUIRE(inj.nth == 0 || is_comm_site(c.site), where, ": [inject] kind bitflip: nth is for comm/ sites");
  } else if (head == "order") {
    LS_REQUIRE(opts.empty(), where, ": [inject] kind order takes no options");
    const ModelDesc desc = describe_model(model);
    LS_REQUIRE(is_op_site(desc, c.site), where, ": [inject] kind order: site must be an op's forward output (",
               op_sites_text(desc), "), got \"", c.site, "\"");
    inj.kind = Injection::Kind::kOrder;
  } else if (head == "outlier") {
    inj.kind = Injection::Kind::kOutlier;
    inj.index = option(opts, "channel", -1, where);
    inj.growth = decimal_option(opts, "growth", 0, where);
    LS_REQUIRE(inj.index >= 0 && inj.growth > 0, where,
               ": [inject] kind outlier: channel=C (an index of the tensor's last dimension) and growth=G > 0 ",
               "(the channel is multiplied by G^n in the n-th step from `step` on) are required");
    inj.persistent = true;
  } else if (head == "spread") {
    inj.kind = Injection::Kind::kSpread;
    inj.power = static_cast<int>(option(opts, "power", 0, where));
    inj.index = option(opts, "index", 0, where);
    LS_REQUIRE(inj.power != 0 && inj.power > -127 && inj.power < 127 && inj.index >= 0, where,
               ": [inject] kind spread: power=P (element `index` is multiplied by 2^P, P != 0) is required");
  } else if (head == "fp8_scale") {
    inj.kind = Injection::Kind::kFp8Scale;
    inj.power = static_cast<int>(option(opts, "power", 0, where));
    LS_REQUIRE(inj.power != 0 && inj.power > -127 && inj.power < 127, where,
               ": [inject] kind fp8_scale: power=P (the tensor's delayed scale is multiplied by 2^P, P != 0) is required");
  } else if (head == "cast") {
    inj.kind = Injection::Kind::kCast;
    inj.format = std::string(opts);
    LS_REQUIRE(inj.format == "bf16" || inj.format == "f16" || inj.format == "e4m3" || inj.format == "e5m2",
               where, ": [inject] kind cast: expected cast:bf16, cast:f16, cast:e4m3 or cast:e5m2, got \"",
               c.kind, "\"");
  } else {
    throw ConfigError(str_cat(where, ": [inject] kind: expected bitflip:bit=B[,index=I], order, cast:FORMAT, ",
                              "outlier:channel=C,growth=G, spread:power=P, fp8_scale:power=P, exit or hang, got \"",
                              c.kind, "\""));
  }
  return inj;
}

bool is_state_site(const std::string& site) {
  return site.starts_with("param/") || site == "optim/m" || site == "optim/v";
}

bool is_gemm_site(const std::string& site) { return site.starts_with("gemm/"); }
bool is_comm_site(const std::string& site) { return site.starts_with("comm/"); }
bool is_checkpoint_site(const std::string& site) { return site.starts_with("ckpt/"); }
bool is_fp8_site(const std::string& site) { return site.starts_with("fp8/"); }

std::vector<Injection> parse_campaign(const std::string& path, const ModelConfig& model) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), path, ": cannot read the campaign's faults");
  std::vector<Injection> faults;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::string where = str_cat(path, ":", n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(str_cat(where, ": not a JSON object (", e.what(), ")"));
    }
    LS_REQUIRE(j.is_object() && j.contains("step") && j.contains("site") && j.contains("kind"), where,
               ": expected {\"step\": S, \"rank\": R, \"site\": \"...\", \"kind\": \"bitflip:bit=B,index=I\"}");
    InjectConfig c;
    c.site = j.at("site").get<std::string>();
    c.step = j.at("step").get<int64_t>();
    c.kind = j.at("kind").get<std::string>();
    c.rank = j.value("rank", int64_t{-1});
    Injection f = parse_injection(c, where, model);
    LS_REQUIRE(faults.empty() || f.step > faults.back().step, where, ": steps must increase (one fault a step), got ",
               f.step, " after ", faults.back().step);
    f.wrap = true;
    faults.push_back(std::move(f));
  }
  return faults;
}

Injector::Injector(std::vector<Injection> schedule, int64_t world_rank, Model& model, std::span<float> m,
                   std::span<float> v, std::function<std::span<float>()> reduced_grads)
    : schedule_(std::move(schedule)), done_(schedule_.size(), false), applied_fault_(schedule_.size(), false),
      rank_(world_rank), model_(model), m_(m), v_(v), reduced_grads_(std::move(reduced_grads)) {
  for (const Injection& f : schedule_) {
    here_.push_back(f.kind != Injection::Kind::kNone && (f.rank < 0 || f.rank == rank_) && model_.holds_site(f.site));
  }
}

bool Injector::at_tensor(const Injection& f) {
  return f.kind != Injection::Kind::kExit && f.kind != Injection::Kind::kHang && f.kind != Injection::Kind::kSlow &&
         !is_state_site(f.site) &&
         !is_gemm_site(f.site) && !is_comm_site(f.site) && !is_checkpoint_site(f.site) && !is_fp8_site(f.site) &&
         f.site != "optim/grad";
}

bool Injector::watches(bool (*at)(const Injection&)) const {
  for (size_t i = 0; i < schedule_.size(); ++i) {
    if (here_[i] && at(schedule_[i])) return true;
  }
  return false;
}

bool Injector::watches_tensors() const { return watches(at_tensor); }
bool Injector::watches_products() const {
  return watches([](const Injection& f) { return is_gemm_site(f.site); });
}
bool Injector::watches_messages() const {
  return watches([](const Injection& f) { return is_comm_site(f.site); });
}

void Injector::on_received(std::string_view group, std::string_view op,
                           std::span<const detect::ReceivedBytes> blocks) {
  if (!now_ || inj_.site.size() != 6 + group.size() + op.size() ||
      inj_.site.compare(5, group.size(), group) != 0 || inj_.site.compare(6 + group.size(), op.size(), op) != 0) {
    return;
  }
  // The gradient buckets reduce on a thread of their own.
  std::lock_guard<std::mutex> lock(received_mutex_);
  if (applied_ || seen_++ != inj_.nth) return;
  int64_t words = 0;
  for (const detect::ReceivedBytes& b : blocks) words += b.bytes / 4;
  int64_t w_index = element(words);
  LS_REQUIRE(w_index < words, "[inject] bitflip index ", inj_.index, " is outside the message ", inj_.site,
             " received (", words, " 32-bit words from its peers)");
  for (const detect::ReceivedBytes& b : blocks) {
    if (w_index >= b.bytes / 4) {
      w_index -= b.bytes / 4;
      continue;
    }
    auto* word = static_cast<unsigned char*>(b.data) + 4 * w_index;
    uint32_t w;
    std::memcpy(&w, word, 4);
    w ^= 1u << inj_.bit;
    std::memcpy(word, &w, 4);
    break;
  }
  applied_ = true;
  applied_fault_[current_] = true;
}

bool Injector::acts_here() const {
  return std::find(here_.begin(), here_.end(), true) != here_.end();
}

void Injector::begin_step(int64_t step) {
  now_ = false;
  inj_ = {};
  for (size_t i = 0; i < schedule_.size() && !now_; ++i) {
    const Injection& f = schedule_[i];
    if (!here_[i] || !(f.persistent ? step >= f.step : step == f.step && !done_[i])) continue;
    now_ = true;
    done_[i] = true;
    current_ = i;
    inj_ = f;
  }
  applied_ = false;
  seen_ = 0;
  if (now_ && inj_.kind == Injection::Kind::kOrder) {
    model_.set_op_mode(inj_.site, model_.mode() == Mode::kCanonical ? Mode::kFast : Mode::kCanonical);
  }
  step_ = step;
  if (now_ && inj_.kind == Injection::Kind::kFp8Scale) {
    Fp8State* fp8 = model_.fp8();
    const size_t i = fp8 != nullptr ? fp8->find(inj_.site.substr(4)) : SIZE_MAX;
    LS_REQUIRE(i != SIZE_MAX && fp8->recipe().scaling == Fp8Scaling::kDelayed, "[inject] site \"", inj_.site,
               "\" is not a tensor with a delayed fp8 scale in this run (fp8/LINEAR/input|weight|grad_output of an fp8 ",
               "linear, recipe delayed)");
    fp8->force_scale(i, std::ldexp(fp8->scale(i), inj_.power));
    applied_ = true;
    applied_fault_[current_] = true;
  }
}

void Injector::apply(std::string_view name, float* data, int64_t n, int64_t last_dim) {
  if (inj_.kind == Injection::Kind::kOutlier) {
    LS_REQUIRE(inj_.index < last_dim, "[inject] outlier channel ", inj_.index, " is outside ", name, " (", last_dim,
               " channels)");
    const float factor = static_cast<float>(std::pow(inj_.growth, static_cast<double>(step_ - inj_.step + 1)));
    for (int64_t e = inj_.index; e < n; e += last_dim) data[e] *= factor;
  } else if (inj_.kind == Injection::Kind::kSpread) {
    const int64_t e = element(n);
    LS_REQUIRE(e < n, "[inject] spread index ", inj_.index, " is outside ", name, " (", n, " elements)");
    data[e] = std::ldexp(data[e], inj_.power);
  } else if (inj_.kind == Injection::Kind::kBitflip) {
    if (applied_) return;  // one element of the step's first micro-batch
    const int64_t e = element(n);
    LS_REQUIRE(e < n, "[inject] bitflip index ", inj_.index, " is outside ", name, " (", n, " elements)");
    data[e] = std::bit_cast<float>(std::bit_cast<uint32_t>(data[e]) ^ (1u << inj_.bit));
  } else if (inj_.kind == Injection::Kind::kCast) {
    for (int64_t i = 0; i < n; ++i) data[i] = round_through(inj_.format, data[i]);
  }
  // order: the op ran in the other mode; its output is seen here.
  applied_ = true;
  applied_fault_[current_] = true;
}

void Injector::on_tensor(std::string_view name, const TensorView& t) {
  if (!now_ || name != inj_.site) return;
  apply(name, t.f32(), t.numel(), t.shape.rank() == 0 ? 1 : t.shape[t.shape.rank() - 1]);
}

void Injector::on_product(std::string_view site, const detect::ProductView& product) {
  if (!now_ || applied_ || site != inj_.site) return;
  const int64_t n = product.M * product.N;
  const int64_t element_index = element(n);
  LS_REQUIRE(element_index < n, "[inject] bitflip index ", inj_.index, " is outside ", site, " (", product.M, " x ",
             product.N, " elements)");
  if (product.f32 != nullptr) {
    apply(site, product.f32, n);
    return;
  }
  // An exact sum (canonical mode): its value moves to the flipped one, as the rounded product would.
  const auto e = static_cast<size_t>(product.offset + element_index);
  const float value = product.exact->round(e);
  const float flipped = std::bit_cast<float>(std::bit_cast<uint32_t>(value) ^ (1u << inj_.bit));
  product.exact->add(e, static_cast<double>(flipped) - static_cast<double>(value));
  applied_ = true;
  applied_fault_[current_] = true;
}

void Injector::on_checkpoint(const std::string& dir, int64_t step_done) {
  if (!now_ || !is_checkpoint_site(inj_.site) || step_done != inj_.step + 1) return;
  const std::string path = dir + (inj_.site == "ckpt/manifest" ? "/manifest.json" : "/tensors-00000.bin");
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  LS_REQUIRE(file.good(), "[inject] site ", inj_.site, ": cannot open ", path);
  file.seekg(0, std::ios::end);
  const int64_t words = static_cast<int64_t>(file.tellg()) / 4, w = element(words);
  LS_REQUIRE(w < words, "[inject] bitflip index ", inj_.index, " is outside ", path, " (", words, " 32-bit words)");
  uint32_t word = 0;
  file.seekg(4 * w);
  file.read(reinterpret_cast<char*>(&word), 4);
  word ^= 1u << inj_.bit;
  file.seekp(4 * w);
  file.write(reinterpret_cast<const char*>(&word), 4);
  LS_REQUIRE(file.good(), "[inject] site ", inj_.site, ": cannot write ", path);
  applied_ = true;
  applied_fault_[current_] = true;
}

void Injector::after_reduce(int64_t, float) {
  if (!now_) return;
  if (inj_.kind == Injection::Kind::kOrder) model_.clear_op_modes();
  if (inj_.site == "optim/grad") {
    const std::span<float> g = reduced_grads_();
    apply(inj_.site, g.data(), static_cast<int64_t>(g.size()));
    return;
  }
  // A campaign's fault that found no such product or tensor is recorded as not applied.
  if (inj_.wrap || !(at_tensor(inj_) || is_gemm_site(inj_.site))) return;
  LS_REQUIRE(applied_ || !is_gemm_site(inj_.site), "[inject] site \"", inj_.site, "\": that product was not computed ",
             "in step ", inj_.step, " on this rank");
  LS_REQUIRE(applied_, "[inject] site \"", inj_.site, "\" is not a tensor of this model (hook names look like ",
             "layer/0/attn/qkv, layer/0/mlp/fc, grad/layer/0/ln1/out, logits; see `lockstep train --dump.dir`)");
}

void Injector::after_update(int64_t) {
  if (now_ && inj_.kind == Injection::Kind::kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(inj_.ms));
  if (!now_ || !is_state_site(inj_.site)) return;
  if (inj_.site == "optim/m" || inj_.site == "optim/v") {
    const std::span<float> moments = inj_.site == "optim/m" ? m_ : v_;
    apply(inj_.site, moments.data(), static_cast<int64_t>(moments.size()));
    return;
  }
  const ParamTensor& t = model_.param(inj_.site.substr(6));
  apply(inj_.site, model_.params() + t.offset, t.numel);
}

void Injector::end_step(const StepRecord& r) {
  // Messages: the whole step's, the update's included (ZeRO's all-gather of the parameters).
  LS_REQUIRE(!now_ || inj_.wrap || applied_ || !is_comm_site(inj_.site), "[inject] site \"", inj_.site,
             "\": this rank received ", seen_, " such message(s) in step ", inj_.step, ", not the ", inj_.nth + 1,
             "th (nth=", inj_.nth, ")");
  if (!now_ || (inj_.kind != Injection::Kind::kExit && inj_.kind != Injection::Kind::kHang)) return;
  std::fprintf(stderr, "rank %lld: [inject] kind %s after step %lld\n", static_cast<long long>(rank_),
               inj_.kind == Injection::Kind::kExit ? "exit" : "hang", static_cast<long long>(r.done()));
  std::fflush(stderr);
  if (inj_.kind == Injection::Kind::kExit) _exit(9);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace lockstep
