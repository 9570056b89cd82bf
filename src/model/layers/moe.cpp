// The mixture-of-experts sub-layer of a pre-norm block: x2 = x1 + Σ_j gate_j · expert_j(norm2(x1)).
//   ln2/out      norm of the stream                                   (B, T, C)
//   moe/router   the router's logits (fp32, whatever the precision)   (B, T, E)
//   moe/res      the stream plus the experts' combined outputs        (B, T, C)
// Each token's top_k experts (kernels/ops/moe.hpp: scores, choice, gates) compute it: its norm
// output is dispatched to rows of the experts' buffer (moe_routing.hpp: expert-major, token order,
// the capacity's drops), every expert runs its MLP (fc, GELU or SwiGLU, proj; linears of the
// recipe's precision) on its rows, and the rows combine back weighted by the gates. The
// load-balancing loss (per sequence) adds its gradient to the router's in the backward; with
// aux-loss-free balancing, a selection bias the trainer moves between steps steers the choice.
// Shared experts (DeepSeek) are one more MLP over every token: x2 = (combine + shared(norm2(x1))) + x1.
// Canonical bits: an expert's weight gradient sums its rows chunk by chunk of the step's batch (64
// tokens; 128 under fp8's Hopper accumulation), one linear backward per chunk's rows with
// token_offset at the chunk's start, so each chunk partial is the chain over that chunk's tokens
// routed to the expert, in token order, whatever the micro-batches or data-parallel ranks.
// Tensor parallelism splits every expert's hidden features as the MLP's; the router is replicated
// (each tp rank routes the same way). The experts' rows are every token's on every tp rank
// (LinearRows::kWhole), so under sequence parallelism the layer routes and combines every token
// of the micro-batch — the norm's output comes gathered — and keeps its stream rows of the result;
// the backward gathers the stream's gradient first.
// Expert parallelism (the plan's ExpertShard): this rank holds experts [first, first + count); its
// tokens' rows of the others go to their ep peers and the outputs come back (ExpertRows: the
// expert-major order, each row with its global token index, so that the weight gradients' chunks
// are those of one process); the backward sends the output gradients and brings back the input
// gradients the same way. The router, the combine and the balancing loss stay on the token's rank.
// Context parallelism (the plan's sequence holds some positions): the capacity and the balancing
// loss span each whole sequence, so the router's logits are gathered over the positions
// (ModelPlan::gather_positions) and every cp rank routes the whole micro-batch — scores, choices,
// drops, the balancing loss and the router's backward, the same bits on each — while dispatching,
// computing and combining its own tokens only; an expert row carries its token's global index, so
// the weight gradients' chunks are the one process's (a chunk's 64 positions lie in one block).
// Each rank records its own tokens' statistics, and the one holding position 0 the sequences'.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/layers/residual_branch.hpp"
#include "src/model/moe_routing.hpp"

namespace lockstep {

namespace {

std::string expert_prefix(const LayerDesc& d, int64_t e) { return d.prefix + "moe/expert/" + std::to_string(e) + "/"; }

// An expert's parameters (x: "layer/3/moe/expert/5/"): an MLP of F hidden features that a `share`
// of the tokens multiply.
// `expert`: the routed expert's index (expert parallelism places it), -1 for a shared one.
void declare_mlp(LayerDesc& d, const std::string& x, int64_t F, double share, int64_t expert) {
  const int64_t C = d.dims.C;
  const std::vector<int64_t> segments = ffn_fc_segments(d, F);
  const int64_t experts = expert >= 0 ? d.experts : 0;
  d.params.push_back({.name = x + "fc/weight", .shape = {ffn_fc_width(d, F), C}, .klass = ParamClass::kMatrix,
                      .matmul = true, .token_share = share, .split_dim = 0, .segments = segments,
                      .expert = expert, .experts = experts});
  if (d.bias) {
    d.params.push_back({.name = x + "fc/bias", .shape = {ffn_fc_width(d, F)}, .klass = ParamClass::kBias,
                        .init = ParamInit::kZeros, .split_dim = 0, .segments = segments, .expert = expert,
                        .experts = experts});
  }
  d.params.push_back({.name = x + "proj/weight", .shape = {C, F}, .klass = ParamClass::kMatrix, .matmul = true,
                      .token_share = share, .init_scale = d.residual_scale, .split_dim = 1, .segments = {F},
                      .expert = expert, .experts = experts});
  if (d.bias) {
    d.params.push_back({.name = x + "proj/bias", .shape = {C}, .klass = ParamClass::kBias, .init = ParamInit::kZeros,
                        .expert = expert, .experts = experts});
  }
}

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  const std::string& pre = d.prefix;
  const double share = static_cast<double>(d.top_k) / static_cast<double>(d.experts);
  d.output = pre + "moe/res";
  d.params.push_back({.name = pre + "ln2/weight", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "ln2/bias", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kZeros});
  }
  d.params.push_back({.name = pre + "moe/router/weight", .shape = {d.experts, m.C}, .klass = ParamClass::kMatrix,
                      .matmul = true, .fp32_only = true});
  for (int64_t e = 0; e < d.experts; ++e) declare_mlp(d, expert_prefix(d, e), m.F, share, e);
  if (d.shared_F > 0) declare_mlp(d, pre + "moe/shared/", d.shared_F, 1.0, -1);

  const std::string ln = pre + "ln2/out", router = pre + "moe/router";
  d.hooks.push_back({.name = ln, .region = HookRegion::kNormOut, .op_site = true});
  d.hooks.push_back({.name = router, .region = HookRegion::kWhole, .op_site = true});
  d.hooks.push_back({.name = d.output, .region = HookRegion::kStream, .op_site = true});

  const std::string g = "grad/";
  d.ops = {
      {ln, "norm (ln2)", {d.input}, "ln2 weights"},
      {router, "linear (moe router)", {ln}, "router weight"},
      {d.output, "moe (route, dispatch, expert MLPs, combine; shared experts) + residual", {ln, router, d.input},
       "experts' weights"},
      {g + ln, "moe backward (combine, experts, router with the balancing loss, dispatch)", {g + d.output, ln, router},
       "experts' and router weights"},
      {g + d.input, "norm backward (ln2) + residual", {g + ln, d.input, g + d.output}, "ln2 weights"},
  };
}

class Moe final : public PreNormBranch {
 public:
  Moe(const LayerDesc& desc, const LayerBuild& b)
      : PreNormBranch(desc, b, "ln2"),
        E_(desc.experts),
        K_(desc.top_k),
        T_(desc.dims.T),
        F_(b.local.F),
        fc_out_(ffn_fc_width(desc, F_)),
        capacity_(moe_capacity(desc.capacity_factor, desc.dims.T, K_, E_)),
        held_(b.ctx.plan().experts(desc)),
        router_name_(name("moe/router")),
        router_w_(b.ctx.find_param(router_name_ + "/weight")),
        router_(b.ctx.plan().linear(desc, *router_w_, LinearRows::kWhole)),
        stats_name_(name("moe")),
        stats_(b.ctx.add_moe_stats(stats_name_, E_)),
        // This rank's share of the shared experts' features (tensor parallelism splits them).
        shared_F_(desc.shared_F > 0 ? b.ctx.find_param(name("moe/shared/proj/weight"))->shape[1] : 0),
        shared_fc_out_(ffn_fc_width(desc, shared_F_)),
        sp_(b.max_stream < b.max_tokens),
        seq_(b.ctx.plan().sequence(T_)),
        cp_(seq_tokens(seq_) < T_),
        first_positions_(std::any_of(seq_.begin(), seq_.end(), [](const SeqBlock& k) { return k.position == 0; })),
        acts_(b.ctx, LayerKind::kMoe, "moe", b.slots, [&](Acts& a) {
          const int64_t BT = b.max_tokens, R = BT * K_, N = b.max_batch * T_;
          grow_to(a.logits, N * E_);
          grow_to(a.probs, N * E_);
          grow_to(a.gates, N * K_);
          if (static_cast<int64_t>(a.experts.size()) < N * K_) a.experts.resize(static_cast<size_t>(N * K_));
          a.routing.size_for(BT, K_, E_, N);
          if (cp_) {
            grow_to(a.local_logits, BT * E_);
            grow_to(a.local_gates, BT * K_);
            if (static_cast<int64_t>(a.local_of.size()) < N) a.local_of.resize(static_cast<size_t>(N));
            if (static_cast<int64_t>(a.global_of.size()) < BT) a.global_of.resize(static_cast<size_t>(BT));
          }
          grow_to(a.xe, R * C_);
          grow_to(a.ye, R * C_);
          if (sp_) grow_to(a.combined, BT * C_);
          if (static_cast<int64_t>(a.row_token.size()) < R) a.row_token.resize(static_cast<size_t>(R));
          if (held_.exchange == nullptr) {  // the experts' rows are this rank's own
            grow_to(a.fc, R * fc_out_);
            grow_to(a.act, R * F_);
          } else {
            a.exchanged.peers = held_.exchange->size();
            a.exchanged.experts = held_.count;
          }
          if (shared_F_ == 0) return;
          grow_to(a.shared_in, BT * C_);
          grow_to(a.shared_fc, BT * shared_fc_out_);
          grow_to(a.shared_act, BT * shared_F_);
          grow_to(a.shared_y, BT * C_);
        }) {
    for (int64_t k = 0; k < held_.count; ++k) {
      experts_.push_back(make_expert(desc, b, expert_prefix(desc, held_.first + k)));
    }
    const int64_t BT = b.max_tokens, R = BT * K_, G = b.max_batch, N = G * T_;
    scratch_ = BT * C_ + 2 * R * C_ + R * F_ + R * fc_out_ + BT * K_ + BT * E_ + G + 2 * G * E_ + (sp_ ? BT * C_ : 0);
    if (cp_) scratch_ += N * (K_ + E_);
    if (shared_F_ > 0) {
      shared_ = make_expert(desc, b, name("moe/shared/"));
      scratch_ += BT * (shared_F_ + shared_fc_out_ + C_);
    }
  }

  int64_t scratch_floats() const override { return scratch_; }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    norm_forward(ctx, p, x, "");
    const float* ln = slot(p).ln.data();
    float* logits = cp_ ? a.local_logits.data() : a.logits.data();
    router_->forward(be, ctx.mode_of(router_name_), {p.BT, C_, E_}, logits, ln, ctx.param(router_w_), nullptr);
    ctx.observe(router_name_, logits, {p.B, p.T, E_});
    if (cp_) {
      map_positions(a, p);
      ctx.plan().gather_positions(logits, a.logits.data(), p.B, T_, E_);
    }
    be.router_forward(router_shape(p), a.probs.data(), a.experts.data(), a.gates.data(), a.logits.data(),
                      ctx.moe_selection_bias(stats_name_));
    MoeRouting& r = a.routing;
    r.assign(a.experts.data(), p.B * T_, K_, T_, capacity_, cp_ ? a.local_of.data() : nullptr);
    if (cp_) take_rows(a, p, a.gates.data(), a.local_gates.data(), K_);
    if (ctx.recording()) record(ctx.moe_stats(stats_), a, p);
    const MoeRowsShape rows{p.BT, r.R, C_, K_};
    be.moe_dispatch(rows, a.xe.data(), ln, r.token_of_row.data());
    for (int64_t i = 0; i < r.R; ++i) a.row_token[i] = p.token_offset + global(a, r.token_of_row[i]);
    // Expert parallelism: the received rows' staging and the held experts' outputs, for this call.
    float* staging = nullptr;
    const ExpertSide side = held_.exchange ? receive_rows(ctx, a, staging) : own_rows(a);
    for (int64_t k = 0; k < held_.count; ++k) {
      const int64_t f = side.first[k], n = side.first[k + 1] - f;
      if (n == 0) continue;
      Expert& xp = experts_[k];
      float* xe = side.x + f * C_;
      float* fc = a.fc.data() + f * fc_out_;
      float* act = a.act.data() + f * F_;
      ctx.store_for(xp.fc_name, xe, n * C_);
      xp.fc->forward(be, ctx.mode(), {n, C_, fc_out_}, fc, xe, ctx.linear_weight(xp.fc_w, xp.fc_name), ctx.param(xp.fc_b));
      activation_forward_rows(be, desc(), ctx.mode(), n, F_, act, fc);
      ctx.store_for(xp.proj_name, act, n * F_);
      xp.proj->forward(be, ctx.mode(), {n, F_, C_}, side.y + f * C_, act, ctx.linear_weight(xp.proj_w, xp.proj_name),
                       ctx.param(xp.proj_b));
    }
    if (held_.exchange) send_back(a.exchanged, side.y, a.ye.data(), staging);
    if (shared_) shared_forward(ctx, p, a, ln);
    // Every token combined (under sequence parallelism into a buffer of its own), then this
    // rank's stream rows of it plus the residual.
    float* y = res(p);
    float* all = sp_ ? a.combined.data() : y;
    be.moe_combine_forward(rows, all, a.ye.data(), r.rows.data(), gates(a));
    if (shared_) be.residual_forward(p.BT * C_, all, all, a.shared_y.data());
    be.residual_forward(p.RS * C_, y, all + stream_first(p) * C_, x);
    ctx.observe(desc().output, y, {p.RB, p.RT, C_});
  }

  // dres: d(x2) in, d(x1) out (the stream gradient, in place).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float*) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    const MoeRouting& r = a.routing;
    const int64_t R = r.R, G = p.BT / p.T;
    float* dnorm = ctx.scratch();           // (BT, C)
    float* dye = dnorm + p.BT * C_;         // (R, C)
    float* dact = dye + R * C_;             // (R, F)
    float* dfc = dact + R * F_;             // (R, fc_out)
    float* dxe = dfc + R * fc_out_;         // (R, C)
    float* dgates = dxe + R * C_;           // (BT, K)
    float* dlogits = dgates + p.BT * K_;    // (BT, E)
    float* aux_loss = dlogits + p.BT * E_;  // (G)
    float* daux = aux_loss + G;             // (G, E)
    float* mean_probs = daux + G * E_;      // (G, E)
    float* dall = mean_probs + G * E_;      // (BT, C): every token's output gradient (sp)
    float* dshared = dall + (sp_ ? p.BT * C_ : 0);  // (BT, C): the shared experts' input gradient
    // Context parallelism: the whole micro-batch's gate and logit gradients.
    float* dgates_all = dshared + (shared_ ? p.BT * (shared_F_ + shared_fc_out_ + C_) : 0);  // (B·T, K)
    float* dlogits_all = dgates_all + p.B * T_ * K_;                                     // (B·T, E)
    const MoeRowsShape rows{p.BT, R, C_, K_};
    if (sp_) {
      ctx.plan().gather_stream(dres, dall, p.BT, C_);
    } else {
      dall = dres;
    }
    // The shared experts' parameters come last: their gradients first.
    if (shared_) shared_backward(ctx, p, a, dall, dshared);
    be.moe_combine_backward(rows, dye, dgates, dall, a.ye.data(), r.rows.data(), gates(a));
    // The experts' rows: this rank's own, or (expert parallelism) its experts' rows from every
    // peer, their output gradients sent here as the inputs were.
    ExpertSide side{.x = a.xe.data(), .first = r.expert_first.data(), .token = a.row_token.data()};
    float* dy = dye;
    float* dx = dxe;
    float* staging = nullptr;
    if (held_.exchange) {
      const ExpertRows& ex = a.exchanged;
      side = {.x = a.xr.data(), .first = ex.expert_first.data(), .token = ex.token.data()};
      const int64_t n = ex.rows;
      staging = ctx.transient(std::max(n, R) * C_ + n * (2 * C_ + F_ + fc_out_));
      dy = staging + std::max(n, R) * C_;
      dact = dy + n * C_;
      dfc = dact + n * F_;
      dx = dfc + n * fc_out_;
      held_.exchange->all_to_all_rows(dye, ex.send_rows.data(), staging, ex.recv_rows.data(), C_);
      ex.to_expert_major(staging, dy, C_);
    }
    // Last expert first: gradients become ready from the end of the layer's parameters.
    for (int64_t k = held_.count - 1; k >= 0; --k) expert_backward(ctx, p, a, side, k, dy, dact, dfc, dx);
    if (held_.exchange) send_back(a.exchanged, dx, dxe, staging);
    const RouterShape rs = router_shape(p);
    if (desc().aux_weight > 0) {
      be.moe_aux_loss(rs, desc().aux_weight, p.dloss, aux_loss, daux, mean_probs, a.probs.data(), a.experts.data());
      if (ctx.recording() && first_positions_) {
        MoeLayerStats& s = ctx.moe_stats(stats_);
        for (int64_t g = 0; g < G; ++g) s.aux_loss += aux_loss[g];
        s.sequences += static_cast<double>(G);
      }
    }
    if (cp_) {
      std::fill_n(dgates_all, p.B * T_ * K_, 0.0f);
      for (int64_t i = 0; i < p.BT; ++i) std::copy_n(dgates + i * K_, K_, dgates_all + a.global_of[i] * K_);
    }
    be.router_backward(rs, cp_ ? dlogits_all : dlogits, a.probs.data(), a.experts.data(), a.gates.data(),
                       cp_ ? dgates_all : dgates, desc().aux_weight > 0 ? daux : nullptr);
    if (cp_) take_rows(a, p, dlogits_all, dlogits, E_);
    router_->backward(be, ctx.mode(), {p.BT, C_, E_}, p.token_offset, dnorm, ctx.sink(router_w_), GradSink{}, dlogits,
                      slot(p).ln.data(), ctx.param(router_w_));
    ctx.grads_ready(p, router_w_);
    be.moe_dispatch_backward(rows, dnorm, dxe, r.rows.data());
    if (shared_) be.residual_forward(p.BT * C_, dnorm, dnorm, dshared);
    norm_backward(ctx, p, x, dres, dnorm + stream_first(p) * C_);
  }

 private:
  struct Acts {
    std::vector<float> logits, probs, gates, xe, fc, act, ye;
    std::vector<float> shared_in, shared_fc, shared_act, shared_y;  // the shared experts' (all tokens)
    std::vector<int32_t> experts;
    MoeRouting routing;
    std::vector<int64_t> row_token;  // the global token index of each of this rank's own rows
    // Context parallelism (logits, probs, gates and experts then hold every position's): the
    // router's output and the gates of the tokens here, and the maps of map_positions.
    std::vector<float> local_logits, local_gates;
    std::vector<int32_t> local_of;
    std::vector<int64_t> global_of;
    // Expert parallelism: the rows exchanged, and the held experts' input rows.
    ExpertRows exchanged;
    std::vector<float> xr;
    std::vector<float> combined;  // sequence parallelism: every token's output, before the stream's rows are kept
  };
  // The rows the held experts compute (expert-major; expert k's rows [first[k], first[k + 1])),
  // their outputs, and the global token index of each.
  struct ExpertSide {
    float* x = nullptr;
    float* y = nullptr;
    const int64_t* first = nullptr;
    const int64_t* token = nullptr;
  };
  struct Expert {
    std::string fc_name, proj_name;
    const ParamTensor *fc_w, *fc_b, *proj_w, *proj_b;
    std::unique_ptr<LinearOp> fc, proj;
  };
  // The linears and parameters of the MLP under `prefix` ("layer/3/moe/expert/5/").
  static Expert make_expert(const LayerDesc& desc, const LayerBuild& b, const std::string& prefix) {
    Expert x;
    x.fc_name = prefix + "fc";
    x.proj_name = prefix + "proj";
    x.fc_w = b.ctx.find_param(x.fc_name + "/weight");
    x.fc_b = b.ctx.find_param(x.fc_name + "/bias");
    x.proj_w = b.ctx.find_param(x.proj_name + "/weight");
    x.proj_b = b.ctx.find_param(x.proj_name + "/bias");
    x.fc = b.ctx.linear(desc, *x.fc_w, x.fc_name, LinearRows::kWhole);
    x.proj = b.ctx.linear(desc, *x.proj_w, x.proj_name, LinearRows::kWhole);
    return x;
  }

  // The router's work: every position of the micro-batch's sequences.
  RouterShape router_shape(const Pass& p) const {
    return {.N = p.B * T_, .E = E_, .K = K_,
            .score = desc().router == RouterKind::kSoftmax ? RouterScore::kSoftmax : RouterScore::kSigmoid,
            .normalize = desc().normalize_gates, .group = T_};
  }

  // Context parallelism: the index among the micro-batch's B·T tokens of each token here, and of
  // each of those its index here (−1: another rank's).
  void map_positions(Acts& a, const Pass& p) const {
    std::fill_n(a.local_of.data(), p.B * T_, -1);
    for_each_token(seq_, p.B, [&](int64_t i, int64_t s, int64_t position) {
      const int64_t g = s * T_ + position;
      a.global_of[static_cast<size_t>(i)] = g;
      a.local_of[static_cast<size_t>(g)] = static_cast<int32_t>(i);
    });
  }
  // Token n here among the micro-batch's B·T.
  int64_t global(const Acts& a, int64_t n) const { return cp_ ? a.global_of[static_cast<size_t>(n)] : n; }
  // local (p.BT, width) = the rows of whole (B·T, width) of the tokens here.
  static void take_rows(const Acts& a, const Pass& p, const float* whole, float* local, int64_t width) {
    for (int64_t i = 0; i < p.BT; ++i) std::copy_n(whole + a.global_of[static_cast<size_t>(i)] * width, width, local + i * width);
  }
  // The gates of the tokens here.
  const float* gates(const Acts& a) const { return cp_ ? a.local_gates.data() : a.gates.data(); }

  // What the shared experts' fc reads: the norm's output, or its bf16 copy where fc runs in bf16
  // (the router reads the fp32 one).
  const float* shared_input(LayerContext& ctx, Acts& a, const float* ln) const {
    return ctx.low_precision(shared_->fc_name) ? a.shared_in.data() : ln;
  }
  void shared_forward(LayerContext& ctx, const Pass& p, Acts& a, const float* ln) {
    Backend& be = ctx.backend();
    Expert& s = *shared_;
    if (ctx.low_precision(s.fc_name)) be.round_to_bf16(p.BT * C_, a.shared_in.data(), ln);
    s.fc->forward(be, ctx.mode(), {p.BT, C_, shared_fc_out_}, a.shared_fc.data(), shared_input(ctx, a, ln),
                  ctx.linear_weight(s.fc_w, s.fc_name), ctx.param(s.fc_b));
    activation_forward_rows(be, desc(), ctx.mode(), p.BT, shared_F_, a.shared_act.data(), a.shared_fc.data());
    ctx.store_for(s.proj_name, a.shared_act.data(), p.BT * shared_F_);
    s.proj->forward(be, ctx.mode(), {p.BT, shared_F_, C_}, a.shared_y.data(), a.shared_act.data(),
                    ctx.linear_weight(s.proj_w, s.proj_name), ctx.param(s.proj_b));
  }
  // From dres (the layer's output gradient: the shared experts' too) to dshared (their input
  // gradient), with their parameter gradients: a dense MLP's backward over every token.
  void shared_backward(LayerContext& ctx, const Pass& p, Acts& a, const float* dres, float* dshared) {
    Backend& be = ctx.backend();
    Expert& s = *shared_;
    float* dact = dshared + p.BT * C_;          // (BT, shared F)
    float* dfc = dact + p.BT * shared_F_;       // (BT, shared fc out)
    s.proj->backward(be, ctx.mode(), {p.BT, shared_F_, C_}, p.token_offset, dact, ctx.sink(s.proj_w),
                     ctx.sink(s.proj_b), dres, a.shared_act.data(), ctx.linear_weight(s.proj_w, s.proj_name));
    activation_backward_rows(be, desc(), ctx.mode(), p.BT, shared_F_, dfc, a.shared_fc.data(), dact);
    s.fc->backward(be, ctx.mode(), {p.BT, C_, shared_fc_out_}, p.token_offset, dshared, ctx.sink(s.fc_w),
                   ctx.sink(s.fc_b), dfc, shared_input(ctx, a, slot(p).ln.data()), ctx.linear_weight(s.fc_w, s.fc_name));
    ctx.grads_ready(p, s.fc_w, s.proj_b != nullptr ? s.proj_b : s.proj_w);
  }

  void record(MoeLayerStats& s, const Acts& a, const Pass& p) const {
    for (int64_t e = 0; e < E_; ++e) {
      s.routed[e] += static_cast<double>(a.routing.routed[e]);
      s.kept[e] += static_cast<double>(a.routing.kept(e));
    }
    for (int64_t n = 0; n < p.BT; ++n) s.add_entropy(a.probs.data() + global(a, n) * E_, 1, E_);
  }

  // This rank's first stream row among the micro-batch's tokens (0 without sequence parallelism).
  static int64_t stream_first(const Pass& p) { return p.stream_offset - p.token_offset; }
  // Every expert here: the rows of this rank's tokens.
  static ExpertSide own_rows(Acts& a) {
    return {a.xe.data(), a.ye.data(), a.routing.expert_first.data(), a.row_token.data()};
  }
  // Expert parallelism: every peer's rows of the experts held here (with their global token
  // indices), in expert-major order; the expert-side buffers grown to hold them, the staging of
  // the received order and the experts' outputs in the context's transient buffer.
  ExpertSide receive_rows(LayerContext& ctx, Acts& a, float*& staging) {
    ExpertRows& ex = a.exchanged;
    ExpertExchange& xc = *held_.exchange;
    ex.plan_sends(a.routing);
    xc.all_to_all(ex.send_counts.data(), ex.recv_counts.data(), held_.count);
    ex.plan_receives();
    const int64_t n = ex.rows;
    if (static_cast<int64_t>(ex.received_tokens.size()) < n) ex.received_tokens.resize(static_cast<size_t>(n));
    xc.all_to_all_rows(a.row_token.data(), ex.send_rows.data(), ex.received_tokens.data(), ex.recv_rows.data(), 1);
    ex.order_tokens();
    const int64_t staged = std::max(n, a.routing.R) * C_;
    staging = ctx.transient(staged + n * C_);
    grow_to(a.xr, n * C_);
    grow_to(a.fc, n * fc_out_);
    grow_to(a.act, n * F_);
    xc.all_to_all_rows(a.xe.data(), ex.send_rows.data(), staging, ex.recv_rows.data(), C_);
    ex.to_expert_major(staging, a.xr.data(), C_);
    return {a.xr.data(), staging + staged, ex.expert_first.data(), ex.token.data()};
  }
  // Expert parallelism: rows (expert-major, C wide) back to the peers whose tokens they are, into
  // out (this rank's rows, in its order), through staging (as many rows as the larger side).
  void send_back(const ExpertRows& ex, const float* rows, float* out, float* staging) const {
    ex.to_received_order(rows, staging, C_);
    held_.exchange->all_to_all_rows(staging, ex.recv_rows.data(), out, ex.send_rows.data(), C_);
  }

  // Held expert k's backward from dye (the expert rows' output gradient) to dxe (their input
  // gradient), and its parameter gradients.
  void expert_backward(LayerContext& ctx, const Pass& p, Acts& a, const ExpertSide& side, int64_t k, const float* dye,
                       float* dact, float* dfc, float* dxe) {
    Expert& xp = experts_[k];
    Backend& be = ctx.backend();
    // Asked even when no row chose it: the storage then holds this micro-batch's zeros.
    const GradSink fc_w = ctx.sink(xp.fc_w), fc_b = ctx.sink(xp.fc_b);
    const GradSink proj_w = ctx.sink(xp.proj_w), proj_b = ctx.sink(xp.proj_b);
    const int64_t first = side.first[k], end = side.first[k + 1], n = end - first;
    if (n > 0) {
      const float* Wfc = ctx.linear_weight(xp.fc_w, xp.fc_name);
      const float* Wproj = ctx.linear_weight(xp.proj_w, xp.proj_name);
      const int64_t* token = side.token + first;
      rows_backward(ctx, p, token, *xp.proj, xp.proj_name, {n, F_, C_}, dact + first * F_, proj_w, proj_b,
                    dye + first * C_, a.act.data() + first * F_, Wproj);
      activation_backward_rows(be, desc(), ctx.mode(), n, F_, dfc + first * fc_out_, a.fc.data() + first * fc_out_,
                               dact + first * F_);
      rows_backward(ctx, p, token, *xp.fc, xp.fc_name, {n, C_, fc_out_}, dxe + first * C_, fc_w, fc_b,
                    dfc + first * fc_out_, side.x + first * C_, Wfc);
    }
    ctx.grads_ready(p, xp.fc_w, xp.proj_b != nullptr ? xp.proj_b : xp.proj_w);
  }

  // One expert linear's backward over s.N of its rows (token: their global token indices, in
  // order). Fast: one call. Canonical: the input gradient in one call (each row's is a dot product
  // of its own), the parameter gradients in one call per chunk of the step's tokens that holds rows
  // of the expert (they are contiguous: its rows are in token order), with token_offset at the
  // chunk's start.
  static void rows_backward(LayerContext& ctx, const Pass& p, const int64_t* token, LinearOp& op,
                            const std::string& linear, LinearShape s, float* dinp, const GradSink& dw,
                            const GradSink& db, const float* dout, const float* inp, const float* w) {
    Backend& be = ctx.backend();
    if (ctx.mode() != Mode::kCanonical) {
      op.backward(be, ctx.mode(), s, p.token_offset, dinp, dw, db, dout, inp, w);
      return;
    }
    op.backward(be, ctx.mode(), s, p.token_offset, dinp, {}, {}, dout, inp, w);
    const int64_t unit = ctx.weight_grad_chunk(linear);
    for (int64_t i = 0; i < s.N;) {
      const int64_t chunk = token[i] / unit;
      int64_t j = i + 1;
      while (j < s.N && token[j] / unit == chunk) ++j;
      LinearShape part = s;
      part.N = j - i;
      op.backward(be, ctx.mode(), part, chunk * unit, nullptr, dw, db, dout + i * s.OC, inp + i * s.IC, w);
      i = j;
    }
  }

  int64_t E_, K_, T_, F_, fc_out_, capacity_;
  ExpertShard held_;  // the routed experts here
  std::string router_name_;
  const ParamTensor* router_w_;
  std::unique_ptr<LinearOp> router_;
  std::string stats_name_;  // "layer/3/moe": its statistics' and selection bias's key
  size_t stats_;
  int64_t shared_F_, shared_fc_out_;  // 0: no shared experts
  bool sp_;                           // the stream holds a share of the tokens (sequence parallelism)
  std::vector<SeqBlock> seq_;         // the positions here (ModelPlan::sequence)
  bool cp_;                           // some of them (context parallelism)
  bool first_positions_;              // position 0 is here: this rank records the sequences' statistics
  std::vector<Expert> experts_;       // the held ones
  std::optional<Expert> shared_;
  SlotActivations<Acts> acts_;
  int64_t scratch_ = 0;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Moe>(desc, b); }

}  // namespace

const LayerType kMoeLayer = {LayerKind::kMoe, "moe", declare, build};

}  // namespace lockstep
