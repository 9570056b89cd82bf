#include "src/train/config.hpp"

#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <toml++/toml.h>

#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"
#include "src/core/parse_number.hpp"
#include "src/core/comma_list.hpp"
#include "src/model/layer.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/train/inject.hpp"
#include "src/train/toml_file.hpp"
#include "verify/detect/finding.hpp"
#include "verify/core/dump.hpp"

namespace lockstep {

namespace {

// One TOML section being read: each field() call declares a key, reads it from the file or from a
// command-line override, and checks its type; finish() rejects every key nobody declared.
class Section {
 public:
  Section(const std::string& file, const std::string& name, const toml::table* table,
          std::map<std::string, std::string>& overrides, nlohmann::json& out)
      : file_(file), name_(name), table_(table), overrides_(overrides), out_(out[name]) {}

  template <class T>
  void field(const std::string& key, T& dst) {
    known_.insert(key);
    const std::string dotted = name_ + "." + key;
    if (auto it = overrides_.find(dotted); it != overrides_.end()) {
      dst = parse_text<T>(it->second, "--" + dotted);
      overrides_.erase(it);
    } else if (table_ != nullptr) {
      if (const toml::node* node = table_->get(key)) dst = from_node<T>(*node, key);
    }
    out_[key] = dst;
  }

  // An integer key that may also be the string "auto" (auto set, dst left as it is).
  void integer_or_auto(const std::string& key, int64_t& dst, bool& automatic) {
    known_.insert(key);
    const std::string dotted = name_ + "." + key;
    if (auto it = overrides_.find(dotted); it != overrides_.end()) {
      automatic = it->second == "auto";
      if (!automatic) dst = parse_text<int64_t>(it->second, "--" + dotted);
      overrides_.erase(it);
    } else if (table_ != nullptr) {
      if (const toml::node* node = table_->get(key)) {
        if (auto v = node->value_exact<int64_t>()) {
          dst = *v;
        } else if (auto t = node->value_exact<std::string>(); t && *t == "auto") {
          automatic = true;
        } else {
          throw ConfigError(str_cat(where(key), ": expected an integer or \"auto\""));
        }
      }
    }
    out_[key] = automatic ? nlohmann::json("auto") : nlohmann::json(dst);
  }

  // A key that lives elsewhere now: using it is an error that says where.
  void moved(const std::string& key, const std::string& now) {
    const std::string dotted = name_ + "." + key;
    const bool given = overrides_.count(dotted) > 0 || (table_ != nullptr && table_->get(key) != nullptr);
    LS_REQUIRE(!given, file_, ": [", name_, "] ", key, " is now ", now);
  }

  void finish() const {
    if (table_ == nullptr) return;
    for (const auto& [k, v] : *table_) {
      const std::string key(k.str());
      if (!known_.count(key)) {
        std::string list;
        for (const auto& kk : known_) list += (list.empty() ? "" : ", ") + kk;
        throw ConfigError(str_cat(file_, ": [", name_, "] unknown key '", key, "' (known: ", list, ")"));
      }
    }
  }

 private:
  std::string where(const std::string& key) const { return str_cat(file_, ": [", name_, "] ", key); }

  template <class T>
  T from_node(const toml::node& node, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node.value_exact<bool>()) return *v;
      throw ConfigError(str_cat(where(key), ": expected true or false"));
    } else if constexpr (std::is_integral_v<T>) {
      if (auto v = node.value_exact<int64_t>()) {
        if constexpr (std::is_unsigned_v<T>) {
          if (*v < 0) throw ConfigError(str_cat(where(key), ": expected a non-negative integer, got ", *v));
        }
        return static_cast<T>(*v);
      }
      throw ConfigError(str_cat(where(key), ": expected an integer"));
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node.value<double>()) {
        if (node.is_number()) return static_cast<T>(*v);
      }
      throw ConfigError(str_cat(where(key), ": expected a number"));
    } else {
      if (auto v = node.value_exact<std::string>()) return *v;
      throw ConfigError(str_cat(where(key), ": expected a string"));
    }
  }

  template <class T>
  static T parse_text(const std::string& text, const std::string& what) {
    if constexpr (std::is_same_v<T, bool>) {
      if (text == "true") return true;
      if (text == "false") return false;
      throw ConfigError(str_cat(what, ": expected true or false, got '", text, "'"));
    } else if constexpr (std::is_integral_v<T>) {
      T v{};
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || ptr != text.data() + text.size()) {
        throw ConfigError(str_cat(what, ": expected an integer, got '", text, "'"));
      }
      return v;
    } else if constexpr (std::is_floating_point_v<T>) {
      const std::optional<double> v = parse_number(text);
      if (!v) throw ConfigError(str_cat(what, ": expected a number, got '", text, "'"));
      return static_cast<T>(*v);
    } else {
      // Strings may be given bare or TOML-quoted.
      if (text.size() >= 2 && text.front() == '"' && text.back() == '"') return text.substr(1, text.size() - 2);
      return text;
    }
  }

  std::string file_, name_;
  const toml::table* table_;
  std::map<std::string, std::string>& overrides_;
  nlohmann::json& out_;
  std::set<std::string> known_;
};

template <class Enum>
void enum_field(Section& s, const std::string& key, Enum& dst, std::string (*to)(Enum),
                Enum (*from)(const std::string&)) {
  std::string text = to(dst);
  s.field(key, text);
  dst = from(text);
}

std::string mode_to(Mode m) { return std::string(mode_name(m)); }
Mode mode_from(const std::string& s) {
  if (s == "canonical") return Mode::kCanonical;
  if (s == "fast") return Mode::kFast;
  throw ConfigError(str_cat("[train] mode: expected \"canonical\" or \"fast\", got \"", s, "\""));
}

std::string precision_to(Precision p) { return std::string(precision_name(p)); }

void read_all(RunConfig& c, const toml::table* root, std::map<std::string, std::string>& ov,
              nlohmann::json& echo) {
  auto section = [&](const std::string& name) {
    const toml::table* t = nullptr;
    if (root != nullptr) {
      if (const toml::node* n = root->get(name)) {
        t = n->as_table();
        LS_REQUIRE(t != nullptr, c.source, ": [", name, "] must be a table");
      }
    }
    return Section(c.source, name, t, ov, echo);
  };

  Section m = section("model");
  m.field("vocab_size", c.model.vocab_size);
  m.field("seq_len", c.model.seq_len);
  m.field("d_model", c.model.d_model);
  m.field("n_layers", c.model.n_layers);
  m.field("n_heads", c.model.n_heads);
  c.model.n_kv_heads = c.model.n_heads;  // default: multi-head attention
  m.field("n_kv_heads", c.model.n_kv_heads);
  m.field("ffn_hidden", c.model.ffn_hidden);
  enum_field(m, "ffn", c.model.ffn, ffn_name, ffn_from_name);
  enum_field(m, "norm", c.model.norm, norm_name, norm_from_name);
  enum_field(m, "pos", c.model.pos, pos_name, pos_from_name);
  m.field("tie_embeddings", c.model.tie_embeddings);
  m.field("bias", c.model.bias);
  m.field("norm_eps", c.model.norm_eps);
  m.field("rope_theta", c.model.rope_theta);
  m.field("init_std", c.model.init_std);
  m.field("seed", c.model.seed);
  m.field("moe_experts", c.model.moe_experts);
  m.field("moe_top_k", c.model.moe_top_k);
  m.field("moe_every", c.model.moe_every);
  m.field("moe_ffn_hidden", c.model.moe_ffn_hidden);
  enum_field(m, "moe_router", c.model.moe_router, router_name, router_from_name);
  m.field("moe_normalize", c.model.moe_normalize);
  m.field("moe_capacity_factor", c.model.moe_capacity_factor);
  m.field("moe_aux_weight", c.model.moe_aux_weight);
  m.field("moe_shared_experts", c.model.moe_shared_experts);
  m.field("moe_bias_update", c.model.moe_bias_update);
  m.finish();

  Section d = section("data");
  d.field("train", c.data.train);
  d.field("val", c.data.val);
  d.finish();

  Section t = section("train");
  t.field("steps", c.train.steps);
  t.field("stop_after", c.train.stop_after);
  t.field("batch_size", c.train.batch_size);
  t.field("micro_batch_size", c.train.micro_batch_size);
  t.field("lr", c.train.lr);
  t.field("min_lr", c.train.min_lr);
  t.field("warmup", c.train.warmup);
  t.field("weight_decay", c.train.weight_decay);
  t.field("weight_decay_on", c.train.weight_decay_on);
  t.field("beta1", c.train.beta1);
  t.field("beta2", c.train.beta2);
  t.field("eps", c.train.eps);
  t.field("grad_clip", c.train.grad_clip);
  t.field("seed", c.train.seed);
  enum_field(t, "mode", c.train.mode, mode_to, mode_from);
  t.field("threads", c.train.threads);
  t.field("isa", c.train.isa);
  t.field("fast_gemm", c.train.fast_gemm);
  t.field("peak_gflops", c.train.peak_gflops);
  t.field("kernel_cache", c.train.kernel_cache);
  enum_field(t, "precision", c.train.precision, precision_to, precision_from_name);
  t.field("fp32_linears", c.train.fp32_linears);
  t.field("master_weights", c.train.master_weights);
  t.field("init_from", c.train.init_from);
  t.field("recompute", c.train.recompute);
  t.finish();

  Section f = section("fp8");
  f.field("recipe", c.train.fp8.recipe);
  f.field("format", c.train.fp8.format);
  f.field("amax_history_len", c.train.fp8.amax_history_len);
  f.field("amax_compute_algo", c.train.fp8.amax_compute_algo);
  f.field("margin", c.train.fp8.margin);
  f.field("power_of_two_scales", c.train.fp8.power_of_two_scales);
  f.field("gemms", c.train.fp8.gemms);
  f.field("accumulate", c.train.fp8.accumulate);
  f.field("bf16_linears", c.train.fp8.bf16_linears);
  f.finish();

  Section k = section("checkpoint");
  k.field("dir", c.checkpoint.dir);
  k.integer_or_auto("every", c.checkpoint.every, c.checkpoint.every_auto);
  k.field("mtbf_hours", c.checkpoint.mtbf_hours);
  k.field("keep", c.checkpoint.keep);
  k.field("keep_every", c.checkpoint.keep_every);
  k.field("async", c.checkpoint.async);
  k.finish();

  Section l = section("log");
  l.field("metrics", c.log.metrics);
  l.field("every", c.log.every);
  l.field("moe", c.log.moe);
  l.finish();

  Section e = section("eval");
  e.field("every", c.eval.every);
  e.field("batches", c.eval.batches);
  e.finish();

  Section p = section("parallel");
  p.field("dp", c.parallel.dp);
  p.field("tp", c.parallel.tp);
  p.field("pp", c.parallel.pp);
  p.field("ep", c.parallel.ep);
  p.field("cp", c.parallel.cp);
  p.field("cp_comm", c.parallel.cp_comm);
  p.field("sp", c.parallel.sp);
  p.field("zero", c.parallel.zero);
  p.field("reduce", c.parallel.reduce);
  p.field("bucket_mb", c.parallel.bucket_mb);
  p.field("overlap", c.parallel.overlap);
  p.field("timeout_s", c.parallel.timeout_s);
  p.field("schedule", c.parallel.schedule);
  p.field("virtual_stages", c.parallel.virtual_stages);
  p.field("stage_layers", c.parallel.stage_layers);
  p.moved("check_replicas", "[verify] replicas");
  p.finish();

  Section v = section("verify");
  v.field("replicas", c.verify.replicas);
  v.field("state_at_rest", c.verify.state_at_rest);
  v.field("spikes", c.verify.spikes);
  v.field("abft", c.verify.abft);
  v.field("collectives", c.verify.collectives);
  v.field("spike_window", c.verify.spike_window);
  v.field("stragglers", c.verify.stragglers);
  v.field("straggler_window", c.verify.straggler_window);
  v.field("straggler_threshold", c.verify.straggler_threshold);
  v.field("straggler_patience", c.verify.straggler_patience);
  v.field("on_straggler", c.verify.on_straggler);
  v.field("loss_spike_threshold", c.verify.loss_spike_threshold);
  v.field("grad_norm_spike_threshold", c.verify.grad_norm_spike_threshold);
  v.field("on_fault", c.verify.on_fault);
  v.field("max_replays", c.verify.max_replays);
  v.field("replay_every", c.verify.replay_every);
  v.field("buddy_every", c.verify.buddy_every);
  v.field("reference_every", c.verify.reference_every);
  v.field("on_spike", c.verify.on_spike);
  v.field("fp8_sentinel_every", c.verify.fp8_sentinel_every);
  v.field("fp8_sentinel_rows", c.verify.fp8_sentinel_rows);
  v.field("fp8_sentinel_lambda", c.verify.fp8_sentinel_lambda);
  v.field("fp8_saturation_threshold", c.verify.fp8_saturation_threshold);
  v.field("fp8_underflow_threshold", c.verify.fp8_underflow_threshold);
  v.field("fp8_patience", c.verify.fp8_patience);
  v.field("on_fp8", c.verify.on_fp8);
  v.finish();

  Section u = section("dump");
  u.field("dir", c.dump.dir);
  u.field("tensors", c.dump.tensors);
  u.field("steps", c.dump.steps);
  u.finish();

  Section j = section("inject");
  j.field("site", c.inject.site);
  j.field("step", c.inject.step);
  j.field("kind", c.inject.kind);
  j.field("rank", c.inject.rank);
  j.field("persistent", c.inject.persistent);
  j.field("campaign", c.inject.campaign);
  j.field("campaign_out", c.inject.campaign_out);
  j.finish();
}

void validate(const RunConfig& c, ConfigUse use) {
  c.model.validate();
  const TrainConfig& t = c.train;
  LS_REQUIRE(use == ConfigUse::kBench || !c.data.train.empty(), c.source,
             ": [data] train: a token file is required");
  LS_REQUIRE(t.steps >= 1, c.source, ": [train] steps (", t.steps, ") must be >= 1");
  LS_REQUIRE(t.stop_after == -1 || (t.stop_after >= 0 && t.stop_after < t.steps), c.source,
             ": [train] stop_after (", t.stop_after, ") must be a 0-based step of the run, 0 <= stop_after < steps (",
             t.steps, "), or -1 to run every step");
  LS_REQUIRE(t.batch_size >= 1, c.source, ": [train] batch_size (", t.batch_size, ") must be >= 1");
  LS_REQUIRE(t.micro_batch_size >= 0, c.source, ": [train] micro_batch_size (", t.micro_batch_size,
             ") must be >= 0");
  LS_REQUIRE(t.batch_size % t.micro_batch() == 0, c.source, ": [train] batch_size (", t.batch_size,
             ") must be a multiple of micro_batch_size (", t.micro_batch(), ")");
  // Canonical mode: micro-batches split the token reductions, so each must end on a chunk
  // boundary (kernels/ops/canonical.hpp) for the gradient not to depend on the split.
  LS_REQUIRE(t.mode != Mode::kCanonical || t.micro_batch() == t.batch_size ||
                 (t.micro_batch() * c.model.seq_len) % kCanonicalChunk == 0,
             c.source, ": [train] micro_batch_size (", t.micro_batch(), ") x seq_len (", c.model.seq_len,
             ") = ", t.micro_batch() * c.model.seq_len, " tokens must be a multiple of ", kCanonicalChunk,
             " in canonical mode, so that gradient accumulation falls on chunk boundaries");
  LS_REQUIRE(t.lr > 0 && t.min_lr >= 0 && t.min_lr <= t.lr, c.source,
             ": [train] need lr > 0 and 0 <= min_lr <= lr (lr ", t.lr, ", min_lr ", t.min_lr, ")");
  LS_REQUIRE(t.warmup >= 0, c.source, ": [train] warmup (", t.warmup, ") must be >= 0");
  LS_REQUIRE(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1, c.source,
             ": [train] beta1 and beta2 must be in [0, 1)");
  LS_REQUIRE(t.eps > 0, c.source, ": [train] eps (", t.eps, ") must be > 0");
  LS_REQUIRE(t.weight_decay >= 0, c.source, ": [train] weight_decay must be >= 0");
  DecayPolicy::parse(t.weight_decay_on, c.source + ": [train] weight_decay_on");  // throws on a bad list
  parse_recompute(t.recompute, c.source + ": [train] recompute");
  const VerifyConfig& v = c.verify;
  LS_REQUIRE(v.spike_window >= 10, c.source, ": [verify] spike_window (", v.spike_window,
             ") must be >= 10 steps (a robust z-score needs a history)");
  LS_REQUIRE(v.loss_spike_threshold > 0 && v.grad_norm_spike_threshold > 0, c.source,
             ": [verify] loss_spike_threshold (", v.loss_spike_threshold, ") and grad_norm_spike_threshold (",
             v.grad_norm_spike_threshold, ") must be > 0");
  detect::parse_fault_action(v.on_fault, c.source + ": [verify] on_fault", true);
  if (!c.inject.campaign.empty()) {
    LS_REQUIRE(c.inject.site.empty() && c.inject.kind.empty(), c.source,
               ": [inject] campaign takes its faults from its file: no site or kind beside it");
    LS_REQUIRE(v.on_fault == "rollback" && !c.inject.campaign_out.empty(), c.source,
               ": [inject] campaign needs [verify] on_fault = \"rollback\" (each fault meets a clean state) and "
               "[inject] campaign_out (where its records go)");
  }
  LS_REQUIRE(v.replay_every >= 0, c.source, ": [verify] replay_every (", v.replay_every,
             ") must be >= 0 (0: no replay; N: every N-th step runs twice)");
  LS_REQUIRE(v.buddy_every >= 0, c.source, ": [verify] buddy_every (", v.buddy_every,
             ") must be >= 0 (0: no buddy replay; N: every N-th step each dp group computes its neighbour's batch too)");
  LS_REQUIRE(v.reference_every >= 0, c.source, ": [verify] reference_every (", v.reference_every,
             ") must be >= 0 (0: no reference checks; N: every N-th step one op is re-checked)");
  LS_REQUIRE(v.max_replays >= 1, c.source, ": [verify] max_replays (", v.max_replays,
             ") must be >= 1 (replays of a step before its fault counts as persistent)");
  detect::parse_fault_action(v.on_spike, c.source + ": [verify] on_spike");
  detect::parse_fault_action(v.on_straggler, c.source + ": [verify] on_straggler");
  detect::parse_fault_action(v.on_fp8, c.source + ": [verify] on_fp8");
  LS_REQUIRE(v.fp8_sentinel_every >= 0 && v.fp8_sentinel_rows >= 1 && v.fp8_sentinel_lambda > 0, c.source,
             ": [verify] fp8_sentinel_every must be >= 0 (0: no shadow checks), fp8_sentinel_rows >= 1 and "
             "fp8_sentinel_lambda > 0");
  LS_REQUIRE(v.fp8_saturation_threshold >= 0 && v.fp8_underflow_threshold >= 0 && v.fp8_patience >= 1, c.source,
             ": [verify] fp8_saturation_threshold and fp8_underflow_threshold are fractions, >= 0, and "
             "fp8_patience a number of steps, >= 1");
  LS_REQUIRE(t.grad_clip >= 0, c.source, ": [train] grad_clip (", t.grad_clip, ") must be >= 0 (0 = off)");
  LS_REQUIRE(t.threads >= 0, c.source, ": [train] threads (", t.threads, ") must be >= 0 (0 = all cores)");
  LS_REQUIRE(t.isa == "auto" || t.isa == "avx2" || t.isa == "avx512", c.source,
             ": [train] isa: expected \"auto\", \"avx2\" or \"avx512\", got \"", t.isa, "\"");
  LS_REQUIRE(!t.kernel_cache.empty() && t.kernel_cache.back() != '/', c.source,
             ": [train] kernel_cache: expected \"auto\", \"off\" or a file path, got \"", t.kernel_cache, "\"");
  LS_REQUIRE(t.fast_gemm == "auto" || t.fast_gemm == "openblas" || t.fast_gemm == "lockstep", c.source,
             ": [train] fast_gemm: expected \"auto\", \"openblas\" or \"lockstep\", got \"", t.fast_gemm, "\"");
  LS_REQUIRE(t.peak_gflops >= 0, c.source, ": [train] peak_gflops must be >= 0 (0 = measure)");
  const TrainConfig::Fp8& f = t.fp8;
  LS_REQUIRE(f.recipe == "delayed" || f.recipe == "current" || f.recipe == "mxfp8" || f.recipe == "blockwise", c.source,
             ": [fp8] recipe: expected \"delayed\", \"current\", \"mxfp8\" or \"blockwise\", got \"", f.recipe, "\"");
  LS_REQUIRE(f.format == "hybrid" || f.format == "e4m3", c.source,
             ": [fp8] format: expected \"hybrid\" (e4m3 forward, e5m2 gradients) or \"e4m3\", got \"", f.format, "\"");
  LS_REQUIRE(f.amax_compute_algo == "max" || f.amax_compute_algo == "most_recent", c.source,
             ": [fp8] amax_compute_algo: expected \"max\" or \"most_recent\", got \"", f.amax_compute_algo, "\"");
  LS_REQUIRE(f.accumulate == "fp32" || f.accumulate == "hopper", c.source,
             ": [fp8] accumulate: expected \"fp32\" or \"hopper\" (the limited accumulator of Hopper tensor cores), "
             "got \"", f.accumulate, "\"");
  LS_REQUIRE(f.amax_history_len >= 1, c.source, ": [fp8] amax_history_len (", f.amax_history_len, ") must be >= 1");
  LS_REQUIRE(f.margin >= 0 && f.margin <= 64, c.source, ": [fp8] margin (", f.margin, ") must be in [0, 64]");
  for (const std::string_view g : split_commas(f.gemms)) {
    LS_REQUIRE(g == "fprop" || g == "dgrad" || g == "wgrad", c.source, ": [fp8] gemms: \"", g,
               "\" is not a GEMM; expected a comma-separated list of fprop, dgrad, wgrad");
  }
  LS_REQUIRE(t.master_weights || t.precision == Precision::kBf16, c.source,
             ": [train] master_weights = false needs precision = \"bf16\" (bf16 parameters updated by stochastic "
             "rounding); an fp32 run's parameters are its master weights");
  const ModelDesc desc = describe_model(c.model);
  for (const auto& [list, where] : {std::pair{&t.fp32_linears, "[train] fp32_linears"},
                                    std::pair{&t.fp8.bf16_linears, "[fp8] bf16_linears"}}) {
    std::vector<std::string> entries;
    for (const std::string_view e : split_commas(*list)) {
      LS_REQUIRE(!e.empty(), c.source, ": ", where, ": an empty name in \"", *list,
                 "\"; expected a comma-separated list of linears (head, layer/N/attn/qkv, ...) or prefixes");
      entries.emplace_back(e);
    }
    const std::string unmatched = PrecisionRecipe::unmatched(entries, desc);
    LS_REQUIRE(unmatched.empty(), c.source, ": ", where, ": \"", unmatched,
               "\" names no linear layer of this model (they are head, layer/N/attn/qkv, layer/N/attn/proj, "
               "layer/N/mlp/fc and layer/N/mlp/proj, or any prefix of them that ends at a '/')");
  }
  LS_REQUIRE(c.checkpoint.every >= 0 && c.checkpoint.keep >= 0 && c.checkpoint.keep_every >= 0, c.source,
             ": [checkpoint] every, keep and keep_every must be >= 0");
  LS_REQUIRE(c.checkpoint.mtbf_hours > 0 && std::isfinite(c.checkpoint.mtbf_hours), c.source,
             ": [checkpoint] mtbf_hours must be a positive number of hours, got ", c.checkpoint.mtbf_hours);
  LS_REQUIRE(c.log.every >= 1, c.source, ": [log] every (", c.log.every, ") must be >= 1");
  LS_REQUIRE(c.eval.every >= 0 && c.eval.batches >= 1, c.source,
             ": [eval] every must be >= 0 and batches >= 1");
  const ParallelConfig& p = c.parallel;
  LS_REQUIRE(p.zero >= 0 && p.zero <= parallel::kMaxZeroStage, c.source, ": [parallel] zero (", p.zero,
             ") must be 0 (replicated), 1 (sharded optimizer state), 2 (sharded state and gradients) or 3 (sharded "
             "state, gradients and parameters)");
  LS_REQUIRE(p.reduce == "exact" || p.reduce == "fast", c.source,
             ": [parallel] reduce: expected \"exact\" or \"fast\", got \"", p.reduce, "\"");
  parallel::parse_cp_comm(p.cp_comm, c.source);
  LS_REQUIRE(p.bucket_mb > 0 && p.bucket_mb <= 1 << 20, c.source, ": [parallel] bucket_mb (", p.bucket_mb,
             ") must be > 0 and at most 1048576 (MiB of fp32 gradient per reduction bucket)");
  LS_REQUIRE(p.timeout_s > 0, c.source, ": [parallel] timeout_s (", p.timeout_s, ") must be > 0");
  verify::StepSet(c.dump.steps, c.source + ": [dump] steps");  // throws on a malformed list
  parse_injection(c.inject, c.source, c.model);
}

}  // namespace

PrecisionRecipe TrainConfig::precision_recipe() const {
  PrecisionRecipe r;
  r.linears = precision;
  for (const std::string_view e : split_commas(fp32_linears)) r.fp32_linears.emplace_back(e);
  r.master_weights = master_weights;
  Fp8Recipe& f = r.fp8;
  f.scaling = fp8.recipe == "current"     ? Fp8Scaling::kCurrent
              : fp8.recipe == "mxfp8"     ? Fp8Scaling::kMxfp8
              : fp8.recipe == "blockwise" ? Fp8Scaling::kBlockwise
                                          : Fp8Scaling::kDelayed;
  f.hybrid = fp8.format != "e4m3";
  f.amax_history_len = fp8.amax_history_len;
  f.amax_max = fp8.amax_compute_algo != "most_recent";
  f.margin = fp8.margin;
  f.power_of_two = fp8.power_of_two_scales;
  f.accumulation = fp8.accumulate == "hopper" ? Accumulation::kHopperFp8 : Accumulation::kFp32;
  f.fprop = f.dgrad = f.wgrad = false;
  for (const std::string_view g : split_commas(fp8.gemms)) {
    (g == "fprop" ? f.fprop : g == "dgrad" ? f.dgrad : f.wgrad) = true;
  }
  f.bf16_linears.clear();
  for (const std::string_view e : split_commas(fp8.bf16_linears)) f.bf16_linears.emplace_back(e);
  return r;
}

AdamWConfig TrainConfig::adamw() const {
  AdamWConfig c{static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps),
                static_cast<float>(weight_decay), DecayPolicy::parse(weight_decay_on, "[train] weight_decay_on")};
  c.bf16_params = precision_recipe().bf16_params();
  c.seed = seed;
  return c;
}

nlohmann::json RunConfig::to_json() const {
  RunConfig copy = *this;
  std::map<std::string, std::string> none;
  nlohmann::json out;
  read_all(copy, nullptr, none, out);
  return out;
}

namespace {

// A JSON object of configuration values (RunConfig::to_json's) as the TOML table it was read from.
toml::table toml_of(const nlohmann::json& object) {
  toml::table t;
  for (const auto& [key, v] : object.items()) {
    if (v.is_object()) {
      t.insert(key, toml_of(v));
    } else if (v.is_boolean()) {
      t.insert(key, v.get<bool>());
    } else if (v.is_number_integer()) {
      t.insert(key, v.get<int64_t>());
    } else if (v.is_number_float()) {
      t.insert(key, v.get<double>());
    } else if (v.is_string()) {
      t.insert(key, v.get<std::string>());
    } else {
      throw ConfigError(str_cat("a configuration value of '", key, "' is not a table, boolean, number or string: ",
                                v.dump()));
    }
  }
  return t;
}

RunConfig read_run_config(const std::string& source, const toml::table& root,
                          const std::vector<std::pair<std::string, std::string>>& overrides, ConfigUse use) {
  RunConfig c;
  c.source = source;
  const std::string& path = source;
  static const std::set<std::string> kSections = {"model", "data", "train", "fp8", "checkpoint", "log", "eval",
                                                  "parallel", "verify", "dump", "inject"};
  for (const auto& [k, v] : root) {
    LS_REQUIRE(kSections.count(std::string(k.str())), path, ": unknown section [", k.str(),
               "] (known: checkpoint, data, dump, eval, fp8, inject, log, model, parallel, train, verify)");
  }
  std::map<std::string, std::string> ov;
  for (const auto& [key, value] : overrides) {
    const auto dot = key.find('.');
    LS_REQUIRE(dot != std::string::npos && kSections.count(key.substr(0, dot)), "--", key,
               ": unknown section '", key.substr(0, key.find('.')),
               "' (known: checkpoint, data, dump, eval, fp8, inject, log, model, parallel, train, verify)");
    ov[key] = value;
  }
  nlohmann::json echo;
  read_all(c, &root, ov, echo);
  if (!ov.empty()) {
    throw ConfigError(str_cat("--", ov.begin()->first, ": unknown key '",
                              ov.begin()->first.substr(ov.begin()->first.find('.') + 1), "' in section [",
                              ov.begin()->first.substr(0, ov.begin()->first.find('.')), "]"));
  }
  validate(c, use);
  return c;
}

}  // namespace

RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides,
                          ConfigUse use) {
  return read_run_config(path, parse_toml_file(path), overrides, use);
}

RunConfig run_config_of_json(const nlohmann::json& config, const std::string& source,
                             const std::vector<std::pair<std::string, std::string>>& overrides, ConfigUse use) {
  LS_REQUIRE(config.is_object(), source, ": the configuration is not a JSON object");
  return read_run_config(source, toml_of(config), overrides, use);
}

std::string model_config_difference(const nlohmann::json& then, const nlohmann::json& now, const std::string& now_name) {
  const nlohmann::json defaults = RunConfig{}.to_json()["model"];
  for (const auto& [key, value] : now["model"].items()) {
    const nlohmann::json was = then["model"].contains(key) ? then["model"][key] : defaults.value(key, nlohmann::json());
    if (was != value) return str_cat(key, " = ", was.dump(), ", ", now_name, " has ", value.dump());
  }
  return {};
}

}  // namespace lockstep
