"""The GPT model of a Lockstep config rebuilt in PyTorch, for scripts/compare_pytorch.sh.

Two commands, each printing one JSON object on stdout:
  time   trains the fp32 PyTorch model from Lockstep's exported initial parameters on the batches
         `lockstep bench --tokens-out` used (same steps, same learning rates), timing each step the
         way `lockstep bench` does (forward + backward + grad clip + AdamW); reports tokens/s,
         every step's loss, and which BLAS library and OpenBLAS kernel this process runs on.
  bound  the step-1 loss in fp64 (the near-exact value) and a first-order bound on how far any
         fp32 evaluation of the same formulas may be from it (the derivation is at `bound_step1`).

The model is Lockstep's GPT-2 configuration (learned positions, LayerNorm, GELU tanh form, tied
embeddings, biases); `check_supported` refuses any other. Parameter names are Lockstep's
(`layer/0/attn/qkv/weight`, ...), laid out as nn.Linear expects (out_features, in_features).
Run with /usr/bin/python3 (Debian's python3-torch and python3-numpy). Not here: running Lockstep,
comparing the two sides (the shell script does both).
"""
import argparse
import ctypes
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    """Tensors and metadata of a safetensors file: u64 header length, JSON header, raw data."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name] = arr.reshape(info["shape"])
    return tensors, meta


def check_supported(meta):
    want = {"ffn": "gelu", "norm": "layernorm", "pos": "learned", "tie_embeddings": "true", "bias": "true"}
    for key, value in want.items():
        if meta.get(key) != value:
            sys.exit(f"compare_pytorch.py: the PyTorch model covers {want}; the exported model has {key}={meta.get(key)}")
    if meta["n_kv_heads"] != meta["n_heads"]:
        sys.exit("compare_pytorch.py: grouped key/value heads are not covered (n_kv_heads != n_heads)")


def shape_of(meta):
    return {k: int(meta[k]) for k in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "ffn_hidden")} | {
        "eps": float(meta["norm_eps"])}


def load_params(path, dtype):
    arrays, meta = read_safetensors(path)
    check_supported(meta)
    params = {name: torch.tensor(a.astype(np.float64 if dtype == torch.float64 else np.float32)) for name, a in arrays.items()}
    for p in params.values():
        p.requires_grad_(True)
    return params, shape_of(meta)


def read_tokens(path, shape):
    """(steps, 2, B, T) int32 from `lockstep bench --tokens-out`: inputs then targets per step."""
    toks = np.fromfile(path, dtype="<i4")
    if toks.size != math.prod(shape):
        sys.exit(f"compare_pytorch.py: {path} holds {toks.size} tokens, expected {shape}")
    return torch.from_numpy(toks.reshape(shape).astype(np.int64))


def decays(param):
    """Lockstep's AdamW decays matrices and embeddings (the 2-D tensors), not biases or norm weights."""
    return param.dim() == 2


# ----------------------------------------------------------------------------- fp32 model (timed)

def forward_fp32(P, s, idx, targets):
    """The model as a PyTorch user writes it (F.layer_norm, F.gelu tanh, softmax attention);
    PyTorch 1.13 has no scaled_dot_product_attention."""
    B, T = idx.shape
    C, NH = s["d_model"], s["n_heads"]
    HS = C // NH
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = F.embedding(idx, P["wte"]) + P["wpe"][:T]
    for l in range(s["n_layers"]):
        p = f"layer/{l}/"
        h = F.layer_norm(x, (C,), P[p + "ln1/weight"], P[p + "ln1/bias"], s["eps"])
        q, k, v = F.linear(h, P[p + "attn/qkv/weight"], P[p + "attn/qkv/bias"]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, P[p + "attn/proj/weight"], P[p + "attn/proj/bias"])
        h = F.layer_norm(x, (C,), P[p + "ln2/weight"], P[p + "ln2/bias"], s["eps"])
        h = F.gelu(F.linear(h, P[p + "mlp/fc/weight"], P[p + "mlp/fc/bias"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp/proj/weight"], P[p + "mlp/proj/bias"])
    x = F.layer_norm(x, (C,), P["lnf/weight"], P["lnf/bias"], s["eps"])
    logits = F.linear(x, P["wte"])
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def blas_info():
    """The BLAS library this process loaded and, when it is OpenBLAS, its kernel and build."""
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "blas" in line.split()[-1]})
    info = {"blas_libraries": libs}
    for lib in libs:
        try:
            h = ctypes.CDLL(lib)
            h.openblas_get_corename.restype = ctypes.c_char_p
            h.openblas_get_config.restype = ctypes.c_char_p
            info["openblas_core"] = h.openblas_get_corename().decode()
            info["openblas_config"] = h.openblas_get_config().decode()
            break
        except (OSError, AttributeError):
            continue
    return info


def cmd_time(a):
    torch.set_num_threads(a.threads)
    P, s = load_params(a.weights, torch.float32)
    lrs = json.load(open(a.lockstep_json))["lrs"]
    toks = read_tokens(a.tokens, (len(lrs), 2, a.batch, s["seq_len"]))
    names = list(P)
    groups = [{"params": [P[n] for n in names if decays(P[n])], "weight_decay": a.weight_decay},
              {"params": [P[n] for n in names if not decays(P[n])], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lrs[0], betas=(a.beta1, a.beta2), eps=a.eps)
    losses, step_ms = [], []
    for step, lr in enumerate(lrs):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        if a.autocast == "bf16":  # PyTorch's mixed precision: bf16 GEMMs, fp32 parameters and AdamW
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward_fp32(P, s, toks[step, 0], toks[step, 1])
        else:
            loss = forward_fp32(P, s, toks[step, 0], toks[step, 1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(P.values(), a.grad_clip)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if step >= a.warmup:
            step_ms.append(ms)
    med = statistics.median(step_ms)
    q = statistics.quantiles(step_ms, n=4) if len(step_ms) > 1 else [med, med, med]
    out = {"threads": torch.get_num_threads(), "torch": torch.__version__, "autocast": a.autocast,
           "step_ms_median": med, "step_ms_q1": q[0], "step_ms_q3": q[2],
           "tokens_per_s": a.batch * s["seq_len"] / (med / 1e3), "losses": losses} | blas_info()
    print(json.dumps(out))


# ----------------------------------------------------------------------------- fp64 bound

U = 2.0 ** -24          # fp32 unit roundoff
TRANSCENDENTAL = "exp/log/tanh"
TRANSCENDENTAL_U = 4.0  # within 4u relative (docs/numerics.md, kernels/ops/transcendental.hpp, libm's 2 ulp)
LAMBDA = 8.0            # Higham & Mary's probabilistic bound: λ√n·u in place of γ_n


def gamma(n):
    return n * U / (1 - n * U)


def gamma_prob(n):
    """γ̃_n(λ) = exp(λ√n·u + n·u²/(1-u)) - 1 (Higham & Mary 2019)."""
    return math.expm1(LAMBDA * math.sqrt(n) * U + n * U * U / (1 - U))


def bound_step1(P, s, idx, targets):
    """Step-1 loss in fp64 and first-order bounds on |fp32 loss - exact loss|.

    Derivation. Write each fp32 evaluation as the exact formulas with a local rounding error δ_y
    added at every intermediate y. To first order in u, the loss moves by Σ_y ∂L/∂y · δ_y, so
    |L̂ - L| ≤ Σ_y |∂L/∂y|·b_y where b_y bounds |δ_y| elementwise from y's operands with the
    standard results of docs/numerics.md ("Error bounds"), valid for any summation order (so for Lockstep's canonical
    chains, its fast mode's sgemm, and PyTorch's kernels alike):
      sum of n terms                 γ_{n-1}·Σ|x|
      dot product of length K + bias γ_{K+1}·(|x||W| + |b|)
      k roundings of a product or sum chain   γ_k·(sum of the magnitudes of its terms)
      exp, log, tanh                 4u·|result|   (the figure the Bounded reference charges)
    ∂L/∂y comes from autograd on this fp64 model, which evaluates the same formulas with errors
    2^-29 times smaller than fp32's (left out, like the second-order terms). The parameters and
    tokens are the exact inputs of both sides, so they carry no error. Constants rounded to fp32
    (GELU's k0, k1) are charged one more rounding where they enter.
    The same sum with γ̃_n(λ=8) in place of γ_n gives the probabilistic bound (rounding errors
    independent and mean-zero; it holds with probability at least 1 - 2n·exp(-λ²(1-u)²/2) per
    sum of n terms, about 1 - 3e-14·n).
    Caveat: PyTorch's F.layer_norm computes mean and variance by Welford's updates, not as sums;
    the bound covers the two-pass LayerNorm that Lockstep computes, so for PyTorch it is the bound
    of the textbook formulas, not a proof about its kernel.
    Returns (fp64 loss, worst-case bound, probabilistic bound, number of rounding sites).
    """
    nodes = []  # (tensor, n: γ_n applies (or TRANSCENDENTAL), magnitude)

    def reg(y, n, mag):
        y.retain_grad()
        nodes.append((y, n, mag.detach()))
        return y

    B, T = idx.shape
    C, NH, V = s["d_model"], s["n_heads"], s["vocab_size"]
    HS = C // NH
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def layernorm(x, w, b):
        # m = Σx / C;  d = x - m;  var = Σd·d / C;  r = 1/sqrt(var + eps);  out = d·r·w + b
        mean = reg(x.sum(-1, keepdim=True) / C, C, x.abs().sum(-1, keepdim=True) / C)
        d = reg(x - mean, 1, (x - mean).abs())
        var = reg((d * d).sum(-1, keepdim=True) / C, C + 1, (d * d).sum(-1, keepdim=True) / C)
        r = reg(1.0 / torch.sqrt(var + s["eps"]), 3, 1.0 / torch.sqrt(var + s["eps"]))
        return reg(d * r * w + b, 3, (d * r * w).abs() + b.abs())

    def linear(x, w, b):
        mag = x.abs() @ w.abs().t() + (b.abs() if b is not None else 0)
        return reg(F.linear(x, w, b), x.size(-1) + 1, mag)

    def gelu(x):
        # (0.5·x)·(1 + tanh(k0·(x + k1·((x·x)·x))))
        k0, k1 = math.sqrt(2 / math.pi), 0.044715
        x3 = reg(x * x * x, 2, (x * x * x).abs())
        inner = reg(x + k1 * x3, 3, x.abs() + k1 * x3.abs())
        arg = reg(k0 * inner, 2, (k0 * inner).abs())
        th = reg(torch.tanh(arg), TRANSCENDENTAL, torch.tanh(arg).abs())
        onep = reg(1 + th, 1, (1 + th).abs())
        return reg(0.5 * x * onep, 1, (0.5 * x * onep).abs())

    x = F.embedding(idx, P["wte"]) + P["wpe"][:T]
    x = reg(x, 1, x.abs())
    for l in range(s["n_layers"]):
        p = f"layer/{l}/"
        h = layernorm(x, P[p + "ln1/weight"], P[p + "ln1/bias"])
        q, k, v = linear(h, P[p + "attn/qkv/weight"], P[p + "attn/qkv/bias"]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        scale = 1.0 / math.sqrt(HS)
        sc = reg((q @ k.transpose(-2, -1)) * scale, HS + 1, (q.abs() @ k.abs().transpose(-2, -1)) * scale)
        sc = sc.masked_fill(mask, float("-inf"))
        d = sc - sc.amax(-1, keepdim=True)  # the row max is exact: no error to charge
        d = reg(d, 1, d.abs().nan_to_num(0.0, 0.0, 0.0))
        e = reg(torch.exp(d), TRANSCENDENTAL, torch.exp(d))
        z = reg(e.sum(-1, keepdim=True), T - 1, e.sum(-1, keepdim=True))
        att = reg(e / z, 2, e / z)  # one division, or e·(1/Z): at most two roundings
        y = reg(att @ v, T, att @ v.abs())
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, P[p + "attn/proj/weight"], P[p + "attn/proj/bias"])
        x = reg(x, 1, x.abs())
        h = layernorm(x, P[p + "ln2/weight"], P[p + "ln2/bias"])
        h = gelu(linear(h, P[p + "mlp/fc/weight"], P[p + "mlp/fc/bias"]))
        x = x + linear(h, P[p + "mlp/proj/weight"], P[p + "mlp/proj/bias"])
        x = reg(x, 1, x.abs())
    x = layernorm(x, P["lnf/weight"], P["lnf/bias"])
    logits = linear(x, P["wte"], None).view(-1, V)
    m = logits.amax(-1, keepdim=True).detach()
    d = reg(logits - m, 1, (logits - m).abs())
    e = reg(torch.exp(d), TRANSCENDENTAL, torch.exp(d))
    z = reg(e.sum(-1, keepdim=True), V - 1, e.sum(-1, keepdim=True))
    lz = reg(torch.log(z), TRANSCENDENTAL, torch.log(z).abs())
    lt = logits.gather(1, targets.reshape(-1, 1))
    # (m + log Z) - l_t or (l_t - m) - log Z: two roundings over these magnitudes either way
    tok = reg(m + lz - lt, 2, m.abs() + lz.abs() + lt.abs())
    n = tok.numel()
    loss = reg(tok.sum() / n, n, tok.abs().sum() / n)
    loss.backward()
    worst = prob = 0.0
    for y, k, mag in nodes:
        weight = float((y.grad.abs() * mag).nan_to_num(0.0).sum())  # Σ |∂L/∂y|·magnitude
        if k == TRANSCENDENTAL:
            worst += TRANSCENDENTAL_U * U * weight
            prob += TRANSCENDENTAL_U * U * weight
        else:
            worst += gamma(k) * weight
            prob += min(gamma(k), gamma_prob(k)) * weight
    return float(loss), worst, prob, len(nodes)


def cmd_bound(a):
    torch.set_num_threads(a.threads)
    P, s = load_params(a.weights, torch.float64)
    nsteps = len(json.load(open(a.lockstep_json))["lrs"])
    toks = read_tokens(a.tokens, (nsteps, 2, a.batch, s["seq_len"]))
    loss, worst, prob, nodes = bound_step1(P, s, toks[0, 0], toks[0, 1])
    print(json.dumps({"loss_fp64": loss, "bound": worst, "bound_probabilistic": prob, "lambda": LAMBDA,
                      "nodes": nodes, "unit_roundoff": U}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["time", "bound"])
    ap.add_argument("--weights", required=True, help="initial parameters (lockstep ckpt export --config)")
    ap.add_argument("--tokens", required=True, help="lockstep bench --tokens-out file")
    ap.add_argument("--lockstep-json", required=True, help="lockstep bench --json file (learning rates)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off", help="time: torch.autocast to bf16")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    a = ap.parse_args()
    {"time": cmd_time, "bound": cmd_bound}[a.command](a)


if __name__ == "__main__":
    main()
