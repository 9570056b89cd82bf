#include "src/model/model.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "src/core/check.hpp"
#include "src/core/det_math.hpp"
#include "src/core/hash.hpp"
#include "src/core/splitmix64.hpp"
#include "src/model/layers/registry.hpp"

namespace lockstep {

namespace {

// Uniform in (0, 1) from the top 53 bits, never 0 (Box-Muller takes its log).
double uniform_open(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53; }

// Standard normal for element i of a tensor keyed by `key` (Box-Muller, cosine branch), with the
// deterministic log/cos of det_math.hpp so every machine draws the same initial model.
double normal_at(uint64_t key, uint64_t i) {
  const double u1 = uniform_open(splitmix64(key ^ splitmix64(2 * i)));
  const double u2 = uniform_open(splitmix64(key ^ splitmix64(2 * i + 1)));
  return std::sqrt(-2.0 * det::log(u1)) * det::cos(2.0 * det::kPi * u2);
}

// f(b, e) over blocks [b, e) of [first, end), split over the OpenMP threads. Zeroing and rounding
// the gradients are memory-bound passes over every parameter (canonical mode: a double and a
// spill flag each, and the fp32 gradient written); on one thread they were a few percent of a
// two-thread step.
template <class F>
void for_param_blocks(int64_t first, int64_t end, const F& f) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t blocks = (end - first + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t b = first + i * kBlock;
    f(static_cast<size_t>(b), static_cast<size_t>(std::min(end, b + kBlock)));
  }
}

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  throw InternalError("recompute_name: unknown Recompute");
}

Recompute parse_recompute(const std::string& text, const std::string& where) {
  for (Recompute r : kRecomputes) {
    if (text == recompute_name(r)) return r;
  }
  throw ConfigError(str_cat(where, ": expected \"none\", \"selective\" or \"full\", got \"", text, "\""));
}

bool LayerContext::recomputed(LayerKind kind) const {
  switch (recompute_) {
    case Recompute::kNone: return false;
    case Recompute::kSelective: return kind == LayerKind::kAttention;
    case Recompute::kFull: return kind == LayerKind::kAttention || kind == LayerKind::kMlp || kind == LayerKind::kMoe;
  }
  return false;
}

const ParamTensor* LayerContext::find_param(const std::string& name) {
  const ParamTensor* t = std::as_const(*this).find_param(name);
  if (t == nullptr || building_ == SIZE_MAX) return t;
  std::vector<const ParamTensor*>& used = layer_params_[building_];
  if (std::find(used.begin(), used.end(), t) == used.end()) used.push_back(t);
  return t;
}

const ParamTensor* LayerContext::find_param(const std::string& name) const {
  for (const auto& t : layout_)
    if (t.name == name) return &t;
  if (tied_copy_ && tied_copy_->name == name) return &*tied_copy_;
  return nullptr;
}

GradSink LayerContext::sink(const ParamTensor* t) {
  if (t == nullptr) return {};
  if (tied_copy_ && t == &*tied_copy_) {
    if (mode_ == Mode::kCanonical) return {nullptr, &tied_exact_, 0};
    return {tied_grad_.data(), nullptr, 0};
  }
  if (storage_) return storage_->sink(*t);
  own_grads();
  if (mode_ == Mode::kCanonical) return {nullptr, exact_grads_.get(), t->offset};
  return {grads_.data() + t->offset, nullptr, 0};
}

std::unique_ptr<LinearOp> LayerContext::linear(const LayerDesc& layer, const ParamTensor& weight,
                                               const std::string& name, LinearRows rows) {
  std::unique_ptr<LinearOp> op = plan_.linear(layer, weight, rows);
  if (!low_precision(name)) return op;
  // bf16 parameters are their own bf16 copy.
  if (precision_.bf16_params()) return bf16_linear(std::move(op));
  if (std::find(copied_weights_.begin(), copied_weights_.end(), &weight) == copied_weights_.end()) {
    copied_weights_.push_back(&weight);
  }
  if (building_ != SIZE_MAX) layer_copies_[building_].push_back(&weight);
  // Made now where they will be read, so that observers see their addresses from the start
  // (AbftBackend::name_weights); refresh_weight_copies makes them if the backend's choice changes.
  if (reads_copy(precision_.fp8_linear(name), backend_.rounds_bf16_as_read(mode_))) weight_copies_.resize(params_.size());
  if (precision_.fp8_linear(name)) {
    Fp8WeightCopies& copies = fp8_weights_[&weight];
    copies.rowwise.resize(static_cast<size_t>(weight.numel));
    if (precision_.fp8.scaling == Fp8Scaling::kMxfp8) copies.columnwise.resize(static_cast<size_t>(weight.numel));
    const bool stream_output = weight.split_dim == 1 && rows == LinearRows::kStream;
    return fp8_linear(std::move(op), {plan_, *fp8_, [this] { return recording(); }, fp8_scratch_, &fp8_tap_}, name, stream_output, copies);
  }
  return bf16_linear(std::move(op), &weights_read_rounded_);
}

void LayerContext::refresh_weight_copies() {
  if (param_storage_ != nullptr) return;  // gather_layer rounds them
  weights_read_rounded_ = backend_.rounds_bf16_as_read(mode_);
  for (const ParamTensor* t : copied_weights_) {
    if (!reads_copy(fp8_weights_.contains(t), weights_read_rounded_)) continue;
    if (weight_copies_.empty()) weight_copies_.resize(params_.size());
    backend_.round_to_bf16(t->numel, weight_copies_.data() + t->offset, params_.data() + t->offset);
  }
}

void LayerContext::gather_layer(size_t layer, size_t next) {
  if (param_storage_ == nullptr) return;
  const std::vector<const ParamTensor*>& tensors = layer_params_[layer];
  const std::span<float* const> where = param_storage_->gather(layer, next);
  for (size_t k = 0; k < tensors.size(); ++k) gathered_[static_cast<size_t>(tensors[k] - layout_.data())] = where[k];
  // Rounding a gathered bf16 linear's weight again (the storage kept it) changes nothing.
  for (const ParamTensor* t : layer_copies_[layer]) backend_.round_to_bf16(t->numel, param(t), param(t));
}

void LayerContext::own_grads() {
  if (storage_ || !grads_.empty()) return;
  grads_.assign(params_.size(), 0.0f);
  if (mode_ == Mode::kCanonical) exact_grads_->reset(params_.size());
}

Model::Model(const ModelConfig& cfg, Mode mode, int64_t micro_batch, ModelOptions options)
    : Model(describe_model(cfg), mode, micro_batch, options) {}

Model::Model(ModelDesc desc, Mode mode, int64_t micro_batch, ModelOptions options)
    : desc_(std::move(desc)),
      options_(options),
      plan_(options.plan ? options.plan : &default_plan_),
      ctx_(mode, *plan_, options.backend ? *options.backend : process_backend(), options.precision),
      max_batch_(micro_batch) {
  desc_.config.validate();
  LS_REQUIRE(micro_batch >= 1, "micro batch size (", micro_batch, ") must be >= 1");
  LS_CHECK(!options_.chunks.empty(), "a model of no layers");
  const std::vector<ParamTensor> all = plan_->param_layout(desc_);
  // Layer l's tensors are [first_tensor[l], first_tensor[l + 1]) of `all`: those it declares, in
  // order, less any the plan leaves to other ranks (expert parallelism's other experts).
  std::vector<size_t> first_tensor(desc_.layers.size() + 1, 0);
  size_t held = 0;
  for (size_t l = 0; l < desc_.layers.size(); ++l) {
    for (const ParamDecl& d : desc_.layers[l].params) held += held < all.size() && all[held].name == d.name ? 1 : 0;
    first_tensor[l + 1] = held;
  }
  LS_CHECK(held == all.size(), "the plan's layout holds ", all.size() - held, " tensors no layer declares");
  // The chunks' parameters: those their layers declare, in list order, numbered from 0 (a tied
  // head needs the embedding in the same chunk).
  std::vector<int64_t> params_first;
  for (size_t c = 0; c < options_.chunks.size(); ++c) {
    params_first.push_back(ctx_.layout_.empty() ? 0 : ctx_.layout_.back().offset + ctx_.layout_.back().numel);
    LayerChunk& range = options_.chunks[c];
    range.end = std::min(range.end, desc_.layers.size());
    LS_REQUIRE(range.slots >= 1, "micro-batches in flight (", range.slots, ") must be >= 1");
    LS_CHECK(range.first < range.end && (c == 0 || options_.chunks[c - 1].end <= range.first), "chunk ", c,
             " of layers [", range.first, ", ", range.end, ") of ", desc_.layers.size());
    for (size_t i = first_tensor[range.first]; i < first_tensor[range.end]; ++i) {
      ParamTensor t = all[i];
      t.offset = ctx_.layout_.empty() ? 0 : ctx_.layout_.back().offset + ctx_.layout_.back().numel;
      ctx_.layout_.push_back(std::move(t));
    }
  }
  num_params_ = ctx_.layout_.empty() ? 0 : ctx_.layout_.back().offset + ctx_.layout_.back().numel;
  if (!options_.sharded_params) ctx_.params_.assign(static_cast<size_t>(num_params_), 0.0f);
  ctx_.gathered_.resize(ctx_.layout_.size());
  // A tied head without its embedding (a later pipeline stage) computes with a copy of wte.
  bool embedding = false, tied_head = false;
  for (const LayerChunk& range : options_.chunks) {
    for (size_t l = range.first; l < range.end; ++l) {
      embedding |= desc_.layers[l].kind == LayerKind::kEmbedding;
      tied_head |= desc_.layers[l].kind == LayerKind::kHead && desc_.layers[l].tied;
    }
  }
  if (tied_head && !embedding) {
    LS_CHECK(!options_.sharded_params, "sharded parameters with a tied copy of wte");
    ParamTensor copy = all.front();
    LS_CHECK(copy.name == "wte", "the first parameter of the list is ", copy.name, ", not wte");
    copy.offset = num_params_;
    ctx_.tied_copy_ = copy;
    ctx_.params_.resize(static_cast<size_t>(num_params_ + copy.numel));
    ctx_.tied_grad_.assign(static_cast<size_t>(copy.numel), 0.0f);
    if (mode == Mode::kCanonical) ctx_.tied_exact_.reset(static_cast<size_t>(copy.numel));
  }

  ctx_.recompute_ = options_.recompute;
  LS_CHECK(!options_.split_backward || options_.recompute == Recompute::kNone,
           "a split backward with recomputation: the recomputed layers' activations are gone by the weight pass");
  ctx_.defer_weight_grads_ = options_.split_backward;
  for (const LayerDesc& l : desc_.layers) {
    if (l.kind == LayerKind::kMoe && l.selection_bias) ctx_.moe_bias_[l.prefix + "moe"].assign(static_cast<size_t>(l.experts), 0.0f);
  }
  // Every fp8 linear of the whole list has its entries, whichever stage this is.
  if (ctx_.precision_.linears == Precision::kFp8) {
    std::vector<std::string> fp8_linears;
    for (const std::string& l : linear_names(desc_)) {
      if (ctx_.precision_.fp8_linear(l)) fp8_linears.push_back(l);
    }
    ctx_.fp8_ = std::make_unique<Fp8State>(ctx_.precision_.fp8, fp8_linears);
    LS_CHECK(!options_.sharded_params, "sharded parameters with fp8 linears");
  }
  const int64_t T = desc_.config.seq_len;
  seq_ = plan_->sequence(T);
  const int64_t max_tokens = micro_batch * seq_tokens(seq_), max_stream = plan_->stream_tokens(max_tokens);
  const size_t stream = static_cast<size_t>(max_stream * desc_.config.d_model);
  int64_t scratch = 0;
  for (const LayerChunk& range : options_.chunks) {
    Chunk& c = chunks_.emplace_back();
    c.range = range;
    c.params_first = params_first[chunks_.size() - 1];
    c.layer_begin = layers_.size();
    for (size_t l = range.first; l < range.end; ++l) {
      const LayerDesc& d = desc_.layers[l];
      const LayerBuild b{ctx_, plan_->local_dims(d), micro_batch, max_tokens, max_stream, range.slots};
      ctx_.building_ = layers_.size();
      ctx_.layer_params_.emplace_back();
      ctx_.layer_copies_.emplace_back();
      layers_.push_back(layer_type(d.kind).build(d, b));
      ctx_.building_ = SIZE_MAX;
      scratch = std::max(scratch, layers_.back()->scratch_floats());
    }
    c.layer_end = layers_.size();
    c.slots.resize(static_cast<size_t>(range.slots));
    for (Slot& s : c.slots) {
      s.inputs.resize(static_cast<size_t>(max_tokens));
      s.targets.resize(s.inputs.size());
      if (range.first > 0) s.stage_input.resize(stream);
    }
  }
  ctx_.scratch_.resize(static_cast<size_t>(scratch));
  for (auto& g : stream_grad_) g.resize(stream);
}

Model::~Model() = default;

bool Model::holds_site(const std::string& site) const {
  const auto own_param = [&](std::string_view name) {
    for (const ParamTensor& t : ctx_.layout_)
      if (t.name == name) return true;
    return false;
  };
  if (site.starts_with("param/")) return own_param(std::string_view(site).substr(6));
  if (site.starts_with("gemm/")) {
    const std::string_view rest = std::string_view(site).substr(5);
    return own_param(rest.substr(0, rest.rfind('/')));
  }
  const std::string_view hook = site.starts_with("grad/") ? std::string_view(site).substr(5) : std::string_view(site);
  bool any_hook = false;
  for (const LayerDesc& l : desc_.layers) {
    for (const HookDecl& h : l.hooks) {
      if (h.name != hook) continue;
      any_hook = true;
      const auto index = static_cast<size_t>(&l - desc_.layers.data());
      for (const Chunk& c : chunks_) {
        if (index >= c.range.first && index < c.range.end) return true;
      }
    }
  }
  return !any_hook;  // not a tensor site
}

std::span<float> Model::tied_copy() {
  if (!ctx_.tied_copy_) return {};
  return {ctx_.params_.data() + ctx_.tied_copy_->offset, static_cast<size_t>(ctx_.tied_copy_->numel)};
}

void Model::add_to_tied_grad(std::function<void(const GradSink&)> add) { ctx_.tied_partial_ = std::move(add); }

const ParamTensor& Model::param(const std::string& name) const {
  const ParamTensor* t = ctx_.find_param(name);
  if (t == nullptr) throw InternalError(str_cat("no parameter named ", name));
  return *t;
}

const float* Model::weight_copy(const ParamTensor& t) const {
  if (ctx_.param_storage_ != nullptr || ctx_.weight_copies_.empty()) return nullptr;
  const auto& copied = ctx_.copied_weights_;
  const bool has = std::any_of(copied.begin(), copied.end(), [&](const ParamTensor* c) { return c->offset == t.offset; });
  return has ? ctx_.weight_copies_.data() + t.offset : nullptr;
}

std::vector<const float*> Model::fp8_weight_copies(const ParamTensor& t) const {
  std::vector<const float*> out;
  for (const auto& [weight, copies] : ctx_.fp8_weights_) {
    if (weight->offset != t.offset) continue;
    for (const std::vector<float>* c : {&copies.rowwise, &copies.columnwise}) {
      if (!c->empty()) out.push_back(c->data());
    }
  }
  return out;
}

uint64_t Model::grad_bytes() const {
  return ctx_.grads_.capacity() * sizeof(float) + ctx_.exact_grads_->size() * (sizeof(double) + 1);
}

void Model::set_grad_storage(GradStorage* storage) {
  ctx_.storage_ = storage;
  if (storage) {
    std::vector<float>().swap(ctx_.grads_);
    ctx_.exact_grads_ = std::make_unique<ExactAccumulator>();
  }
}

float* Model::grads() {
  ctx_.own_grads();
  return ctx_.grads_.data();
}

ExactAccumulator& Model::exact_grads() {
  ctx_.own_grads();
  return *ctx_.exact_grads_;
}

void Model::init_parameters() { init_parameters(0, num_params(), params()); }

void Model::init_parameters(int64_t first, int64_t end, float* out) const {
  for (const auto& t : ctx_.layout_) {
    const int64_t a = std::max(first, t.offset), b = std::min(end, t.offset + t.numel);
    if (a >= b) continue;
    float* w = out + (a - first);
    switch (t.init) {
      case ParamInit::kOnes: std::fill(w, w + (b - a), 1.0f); break;
      case ParamInit::kZeros: std::fill(w, w + (b - a), 0.0f); break;
      case ParamInit::kNormal: {
        const double stddev = static_cast<double>(desc_.config.init_std) * t.init_scale;
        const uint64_t key = xxh64(t.name.data(), t.name.size(), desc_.config.seed);
        for (int64_t i = a - t.offset; i < b - t.offset; ++i) {
          w[i - (a - t.offset)] = static_cast<float>(stddev * normal_at(key, static_cast<uint64_t>(t.global_index(i))));
        }
        break;
      }
    }
  }
  // bf16 parameters (precision.hpp) start as the nearest bf16 values of the fp32 initialisation.
  if (ctx_.precision_.bf16_params()) backend().round_to_bf16(end - first, out, out);
}

void Model::hold_params(bool hold) {
  LS_CHECK(options_.sharded_params, "hold_params: the model holds its parameters whole");
  if (hold) {
    ctx_.params_.assign(static_cast<size_t>(num_params_), 0.0f);
  } else {
    std::vector<float>().swap(ctx_.params_);
  }
}

void Model::set_param_storage(ParamStorage* storage) {
  LS_CHECK(options_.sharded_params, "set_param_storage: the model holds its parameters whole");
  ctx_.param_storage_ = storage;
}

void Model::zero_grad() {
  ctx_.own_grads();
  for (MoeLayerStats& m : ctx_.moe_stats_) m.reset();
  if (ctx_.tied_copy_) {
    std::fill(ctx_.tied_grad_.begin(), ctx_.tied_grad_.end(), 0.0f);
    if (mode() == Mode::kCanonical) ctx_.tied_exact_.zero();
  }
  if (ctx_.storage_) {
    ctx_.storage_->zero();
  } else if (mode() == Mode::kCanonical) {
    for_param_blocks(0, num_params(), [&](size_t b, size_t e) { ctx_.exact_grads_->zero(b, e); });
  } else {
    for_param_blocks(0, num_params(), [&](size_t b, size_t e) {
      std::fill(ctx_.grads_.begin() + static_cast<std::ptrdiff_t>(b),
                ctx_.grads_.begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
    });
  }
}

void Model::finish_grads(int64_t first, int64_t end) {
  LS_CHECK(ctx_.storage_ == nullptr, "finish_grads: the gradients are in a GradStorage, not in the model");
  ctx_.own_grads();
  if (mode() != Mode::kCanonical) return;
  for_param_blocks(first, end, [&](size_t b, size_t e) { ctx_.exact_grads_->round_to(b, e, ctx_.grads_.data() + b); });
}

Model::Slot& Model::acquire(Chunk& c, int64_t mb, const MicroBatch& batch) {
  LS_CHECK(batch.B >= 1 && batch.B <= max_batch_, "micro batch ", batch.B, " exceeds ", max_batch_);
  Slot& s = reserve(c, mb);
  LS_CHECK(s.input_only, "micro-batch ", mb, " is already in flight");
  s.input_only = false;
  const int64_t T = desc_.config.seq_len, TL = seq_tokens(seq_), BT = batch.B * TL;
  // The tokens at the positions held here, block by block (SeqBlock's order).
  auto take = [&](const int32_t* from, std::vector<int32_t>& to) {
    if (from == nullptr) return;
    auto o = to.begin();
    for (const SeqBlock& k : seq_) {
      for (int64_t b = 0; b < batch.B; ++b) o = std::copy_n(from + b * T + k.position, k.length, o);
    }
  };
  take(batch.inputs, s.inputs);
  take(batch.targets, s.targets);
  Pass& p = s.pass;
  p = Pass{};
  p.slot = static_cast<int>(&s - c.slots.data());
  p.B = batch.B;
  p.T = TL;
  p.BT = BT;
  p.RS = plan_->stream_tokens(BT);
  const bool whole = p.RS == BT;
  p.RB = whole ? batch.B : 1;
  p.RT = whole ? TL : p.RS;
  p.token_offset = batch.token_offset;
  p.stream_offset = batch.token_offset + plan_->stream_first(BT);
  p.inputs = s.inputs.data();
  p.targets = s.targets.data();
  return s;
}

Model::Slot& Model::find(Chunk& c, int64_t mb) {
  for (auto& s : c.slots)
    if (s.mb == mb && !s.input_only) return s;
  throw InternalError(str_cat("micro-batch ", mb, " has no forward in flight in chunk ", &c - chunks_.data()));
}

const Model::Slot& Model::find(const Chunk& c, int64_t mb) const {
  return const_cast<Model*>(this)->find(const_cast<Chunk&>(c), mb);
}

Model::Slot& Model::reserve(Chunk& c, int64_t mb) {
  Slot* free = nullptr;
  for (auto& s : c.slots) {
    if (s.mb == mb) return s;
    if (s.mb < 0 && free == nullptr) free = &s;
  }
  LS_CHECK(free != nullptr, "more than ", c.slots.size(), " micro-batches in flight (LayerChunk::slots)");
  free->mb = mb;
  free->input_only = true;
  return *free;
}

float* Model::stage_input(int64_t mb, size_t chunk) {
  Chunk& c = chunks_.at(chunk);
  LS_CHECK(c.range.first > 0, "a chunk that starts with the embedding reads tokens");
  Slot& s = reserve(c, mb);
  LS_CHECK(s.input_only, "micro-batch ", mb, " is already in flight: its input is in use");
  return s.stage_input.data();
}

const float* Model::stage_output(int64_t mb, size_t chunk) const {
  const Chunk& c = chunks_.at(chunk);
  return layers_[c.layer_end - 1]->output(find(c, mb).pass.slot);
}

void Model::run_forward(Chunk& c, Slot& s, bool first_of_step) {
  // The parameters change between steps only, so their bf16 copies are made once a step, at its
  // first micro-batch, as TransformerEngine casts its weights on the first micro-batch only.
  if (first_of_step) ctx_.refresh_weight_copies();
  for (size_t i = c.layer_begin; i < c.layer_end; ++i) {
    ctx_.gather_layer(i, i + 1 < c.layer_end ? i + 1 : SIZE_MAX);
    layers_[i]->forward(ctx_, s.pass, layer_input(c, s, i));
  }
}

void Model::forward(int64_t mb, const MicroBatch& batch, size_t chunk) {
  Chunk& c = chunks_.at(chunk);
  run_forward(c, acquire(c, mb, batch), mb == 0);
}

const float* Model::layer_input(const Chunk& c, const Slot& s, size_t i) const {
  if (i > c.layer_begin) return layers_[i - 1]->output(s.pass.slot);
  return c.range.first > 0 ? s.stage_input.data() : nullptr;
}

void Model::backward(int64_t mb, float dloss, ChunkCombiner& loss_sum, bool last_micro, size_t chunk) {
  Chunk& c = chunks_.at(chunk);
  Slot& s = find(c, mb);
  Pass& p = s.pass;
  p.dloss = dloss;
  p.loss_sum = &loss_sum;
  p.last_micro = last_micro;
  const bool has_loss = c.range.end == desc_.layers.size();
  float* dout = has_loss ? nullptr : stream_grad_[0].data();
  for (size_t i = c.layer_end; i-- > c.layer_begin;) {
    Layer& layer = *layers_[i];
    const float* in = layer_input(c, s, i);
    // The next pass after the first layer's backward is most often the next micro-batch's forward.
    ctx_.gather_layer(i, i > c.layer_begin ? i - 1 : c.layer_begin);
    if (ctx_.recomputed(layer.desc().kind)) {
      // Its activations since its forward are another layer's or micro-batch's now: made again.
      ctx_.recomputing_ = true;
      layer.forward(ctx_, p, in);
      ctx_.recomputing_ = false;
    }
    float* dinp = nullptr;
    if (!layer.desc().input.empty()) {
      dinp = layer.residual() ? dout
                              : (dout == stream_grad_[0].data() ? stream_grad_[1].data() : stream_grad_[0].data());
    }
    layer.backward(ctx_, p, in, dout, dinp);
    dout = dinp;
  }
  input_grad_ = dout;
  if (!options_.split_backward) s.mb = -1;
}

void Model::backward_weight(int64_t mb, bool last_micro, size_t chunk) {
  LS_CHECK(options_.split_backward, "backward_weight without a split backward (ModelOptions::split_backward)");
  Chunk& c = chunks_.at(chunk);
  Slot& s = find(c, mb);
  Pass& p = s.pass;
  p.last_micro = last_micro;
  for (size_t i = c.layer_end; i-- > c.layer_begin;) {
    const float* in = layer_input(c, s, i);
    layers_[i]->backward_weight(ctx_, p, in);
  }
  s.mb = -1;
}

void Model::forward_backward(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t token_offset,
                             float dloss, ChunkCombiner& loss_sum) {
  forward(0, {inputs, targets, B, token_offset});
  backward(0, dloss, loss_sum, false);
}

void Model::forward_backward_batch(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t MB,
                                   int64_t first_token, float dloss, ChunkCombiner& loss_sum) {
  LS_CHECK(MB >= 1 && B % MB == 0, "batch ", B, " is not a multiple of micro-batch ", MB);
  const int64_t T = desc_.config.seq_len;
  Chunk& c = chunks_.at(0);
  for (int64_t mb = 0; mb < B / MB; ++mb) {
    run_forward(c, acquire(c, 0, {inputs + mb * MB * T, targets + mb * MB * T, MB, first_token + mb * MB * T}), mb == 0);
    backward(0, dloss, loss_sum, mb == B / MB - 1);
  }
}

void Model::eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, ChunkCombiner& loss_sum) {
  LS_CHECK(chunks_.size() == 1 && chunks_[0].range.first == 0 && chunks_[0].range.end == desc_.layers.size(),
           "eval_loss needs every layer in one chunk");
  eval_forward(0, {inputs, targets, B, 0}, loss_sum);
}

const float* Model::eval_forward(int64_t mb, const MicroBatch& batch, ChunkCombiner& loss_sum, size_t chunk) {
  Chunk& c = chunks_.at(chunk);
  Slot& s = acquire(c, mb, batch);
  s.pass.eval = true;
  s.pass.loss_sum = &loss_sum;
  ctx_.evaluating_ = true;  // evaluation leaves the fp8 statistics alone
  run_forward(c, s, true);
  ctx_.evaluating_ = false;
  s.mb = -1;
  return layers_[c.layer_end - 1]->output(s.pass.slot);
}

}  // namespace lockstep
