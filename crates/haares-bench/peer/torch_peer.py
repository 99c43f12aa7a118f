"""The PyTorch peer of `haares-bench cost --peer torch,torch-compile`.

The same model as `haares-core`, written again from the paper (App. A and sec:method) in plain
PyTorch, so that the cost protocol can time one training step of each and compare them. It loads
the weights and the config of a haares safetensors checkpoint (docs/checkpoint-format.md), checks
its logits against the ones haares computed on the same tokens, then trains K steps with
`torch.optim.AdamW` and global grad-norm clipping, timing each step, eagerly or with the model
compiled by `torch.compile` (`--compile`: forward and backward through TorchInductor; the first
step includes the compilation).

Modes (one JSON answer per run on stdout, after the marker the Rust side looks for):
  gemm   --size n [--matmul fp32|tf32]  the best of 3 square f32 products, FLOP/s
  train  --checkpoint F --check P --reference R --batch B --seq T --steps K [--matmul fp32|tf32]
         [--compile]
  serve  --checkpoint F --check P --reference R --batch B --seq T [--matmul fp32|tf32] [--compile]
                                     checks the logits, then one training step per `step` line
                                     on stdin, each answered at once
  profile --checkpoint F --batch B --seq T --steps K --warmup W
                                     the steady step's phases, then torch.profiler's table of it
                                     and its matrix products by shape
  version                            PyTorch's version, threads and inter-op threads
"""

import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open

RESULT_PREFIX = "HAARES-COST-RESULT "


def rms_norm(x, weight, eps):
    """Affine RMSNorm over the last dimension: x / sqrt(mean(x²) + ε) ⊙ w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(head_dim, seq, base):
    """cos and sin of pos · base^(−2j/d_h), computed in f64 like haares-core's table."""
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = base ** (-2.0 * pairs / head_dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """Interleaved pairing: dimensions (2j, 2j+1) of each head rotate together (docs/decisions.md, decision 5)."""
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        for name in ("wq", "wk", "wv", "wo"):
            setattr(self, name, torch.nn.Linear(d, d, bias=False))

    def forward(self, x, cos, sin):
        batch, seq, d = x.shape

        def split(projection):
            return projection(x).view(batch, seq, self.heads, d // self.heads).transpose(1, 2)

        q = apply_rope(split(self.wq), cos, sin)
        k = apply_rope(split(self.wk), cos, sin)
        context = F.scaled_dot_product_attention(q, k, split(self.wv), is_causal=True)
        return self.wo(context.transpose(1, 2).reshape(batch, seq, d))


class SwiGlu(torch.nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w_gate = torch.nn.Linear(d, d_ff, bias=False)
        self.w_up = torch.nn.Linear(d, d_ff, bias=False)
        self.w_down = torch.nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class RmsNorm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Router(torch.nn.Module):
    """eq:routingweights: z_s = qᵀ RMSNorm(s) + b_s, α = softmax(z), h̃ = Σ α_s s."""

    def __init__(self, d, eps, detail_bias):
        super().__init__()
        self.query = torch.nn.Parameter(torch.zeros(d))
        self.key_norm = RmsNorm(d, eps)
        self.fixed_bias = None
        if detail_bias is not None and "Learned" in detail_bias:
            self.detail_bias = torch.nn.Parameter(torch.full((1,), detail_bias["Learned"]["init"]))
        elif detail_bias is not None:
            self.fixed_bias = detail_bias["Fixed"]["value"]

    def forward(self, sources, is_detail):
        stack = torch.stack(sources)  # [S, batch, seq, d]
        scores = self.key_norm(stack) @ self.query  # [S, batch, seq]
        if any(is_detail):
            mask = torch.tensor(is_detail, dtype=stack.dtype, device=stack.device)[:, None, None]
            bias = self.detail_bias if self.fixed_bias is None else self.fixed_bias
            scores = scores + mask * bias
        weights = scores.softmax(dim=0)
        return (weights.unsqueeze(-1) * stack).sum(0)


class Layer(torch.nn.Module):
    def __init__(self, config, method):
        super().__init__()
        d, eps = config["d_model"], config["norm_epsilon"]
        self.attn_norm, self.mlp_norm = RmsNorm(d, eps), RmsNorm(d, eps)
        self.attn = Attention(d, config["n_heads"])
        self.mlp = SwiGlu(d, config["d_ff"])
        if method["routed"]:
            self.attn_router = Router(d, eps, method["detail_bias"])
            self.mlp_router = Router(d, eps, method["detail_bias"])
        if method["name"] == "ReZero":
            self.attn_gate = torch.nn.Parameter(torch.zeros(1))
            self.mlp_gate = torch.nn.Parameter(torch.zeros(1))
        if method["name"] == "LayerScale":
            self.attn_scale = torch.nn.Parameter(torch.full((d,), method["scale"]))
            self.mlp_scale = torch.nn.Parameter(torch.full((d,), method["scale"]))

    def sublayer(self, event, x, cos, sin):
        if event % 2 == 0:
            return self.attn(self.attn_norm(x), cos, sin)
        return self.mlp(self.mlp_norm(x))

    def update_scale(self, event):
        part = "attn" if event % 2 == 0 else "mlp"
        gate = getattr(self, f"{part}_gate", None)
        return gate if gate is not None else getattr(self, f"{part}_scale", None)


def split_mix_signs(seed, blocks, events_per_block):
    """The fixed random-sign ablation's signs: SplitMix64 low bits (docs/decisions.md, decision 6)."""
    mask, state, signs = (1 << 64) - 1, seed, []
    for _ in range(blocks):
        row = []
        for _ in range(events_per_block):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            row.append(1.0 if (z ^ (z >> 31)) & 1 else -1.0)
        signs.append(row)
    return signs


def describe_method(config):
    """The residual method of a haares config (its serde JSON) as this script uses it."""
    method = config["method"]
    if isinstance(method, str):
        return {"name": method, "routed": method == "BlockAttnRes", "detail_bias": None}
    (name, options), = method.items()
    if name == "LayerScale":
        init = options["init"]
        if init is None:
            layers = config["n_layers"]
            init = 0.1 if layers <= 18 else 1e-5 if layers <= 24 else 1e-6
        return {"name": name, "routed": False, "detail_bias": None, "scale": init}
    return {"name": name, "routed": True, "detail_bias": options["detail_bias"], **options}


class Model(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.method = config, describe_method(config)
        d, eps = config["d_model"], config["norm_epsilon"]
        self.embed = torch.nn.Embedding(config["vocab_size"], d)
        self.layers = torch.nn.ModuleList(Layer(config, self.method) for _ in range(config["n_layers"]))
        self.final_norm = RmsNorm(d, eps)
        if self.method["routed"]:
            self.final_router = Router(d, eps, None)
        events, blocks = 2 * config["n_layers"], config["blocks"]
        self.events_per_block = events // blocks
        m = self.events_per_block
        detail = self.method.get("detail")
        if isinstance(detail, dict) and "RandomSigns" in detail:
            self.signs = split_mix_signs(detail["RandomSigns"]["seed"], blocks, m)
        else:
            half = (m + 1) // 2  # k = ⌈m/2⌉: the early half takes the extra event
            self.signs = [[1.0 if r <= half else -1.0 for r in range(1, m + 1)]] * blocks

    def forward(self, tokens):
        seq = tokens.shape[1]
        head_dim = self.config["d_model"] // self.config["n_heads"]
        cos, sin = rope_tables(head_dim, seq, self.config["rope_base"])
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        e = self.embed(tokens)
        h = self.routed(e, cos, sin) if self.method["routed"] else self.additive(e, cos, sin)
        return self.final_norm(h) @ self.embed.weight.T

    def additive(self, h, cos, sin):
        """Standard, ReZero, LayerScale: h ← h + scale · f(Norm(h)) over all 2L events."""
        for event in range(2 * len(self.layers)):
            layer = self.layers[event // 2]
            update = layer.sublayer(event, h, cos, sin)
            scale = layer.update_scale(event)
            h = h + (update if scale is None else scale * update)
        return h

    def detail_slot(self, cumulative, detail):
        """The bank's second slot of a pair: D̂ (eq:rmsmatch), D, or C for the C×2 control."""
        options = self.method
        if options["detail"] == "DuplicatedCumulative":
            return cumulative
        if not options["rms_match"]:
            return detail
        rms = lambda x: x.pow(2).mean(-1, keepdim=True).sqrt()
        ratio = rms(cumulative) / (rms(detail) + options["rms_epsilon"])
        gamma = options["rms_gamma"]
        return detail * ratio.clamp(1.0 / gamma, gamma).detach()

    def pair(self, cumulative, detail, with_detail):
        if self.method["name"] != "Haares" or not with_detail:
            return [(cumulative, False)]
        return [(cumulative, False), (self.detail_slot(cumulative, detail), True)]

    def routed(self, e, cos, sin):
        """Block AttnRes and HAARES: every event reads eq:sourceset, writes eq:update."""
        m, completed = self.events_per_block, []
        cumulative = detail = None
        for event in range(2 * len(self.layers)):
            block, r = event // m, event % m + 1
            bank = [(e, False)] + completed
            if r > 1:
                bank += self.pair(cumulative, detail, True)
            layer = self.layers[event // 2]
            router = layer.attn_router if event % 2 == 0 else layer.mlp_router
            read = router([s for s, _ in bank], [d for _, d in bank])
            u = layer.sublayer(event, read, cos, sin)
            sign = self.signs[block][r - 1]
            cumulative = u if r == 1 else cumulative + u
            detail = sign * u if r == 1 else detail + sign * u
            if r == m:
                completed += self.pair(cumulative, detail, block + 1 < self.config["blocks"])
        finals = [e] + [s for s, is_detail in completed if not is_detail]
        return self.final_router(finals, [False] * len(finals))


def load(checkpoint, device):
    with safe_open(checkpoint, framework="pt", device="cpu") as f:
        config = json.loads(f.metadata()["haares_config"])
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    model = Model(config)
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.to(device)


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def set_matmul_precision(matmul):
    """TF32 tensor cores for f32 matrix products (and convolutions) on CUDA, or full fp32."""
    torch.backends.cuda.matmul.allow_tf32 = matmul == "tf32"
    torch.backends.cudnn.allow_tf32 = matmul == "tf32"


def gemm(args):
    set_matmul_precision(args.matmul)
    n = args.size
    a, b = torch.rand(n, n, device=args.device) - 0.5, torch.rand(n, n, device=args.device) - 0.5
    best = math.inf
    for rep in range(4):
        start = time.perf_counter()
        a @ b
        sync(args.device)
        if rep > 0:
            best = min(best, time.perf_counter() - start)
    return {"flops_per_s": 2.0 * n**3 / best}


def optimizer(model):
    """The paper's AdamW: decay 0.01 on matrices only (embedding and projections)."""
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decayed, "weight_decay": 0.01}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)


def check_agreement(args):
    """Our logits of the perturbed copy against the peer's, computed eagerly in full fp32: the
    agreement is about the model, not the precision the steps are then timed at."""
    with open(args.reference) as f:
        reference = json.load(f)
    tokens = torch.tensor(reference["tokens"], device=args.device)
    set_matmul_precision("fp32")
    with torch.no_grad():
        logits = load(args.check, args.device)(tokens).flatten().cpu().double()
    expected = torch.tensor(reference["logits"], dtype=torch.float64)
    set_matmul_precision(args.matmul)
    return {
        "logits_max_abs_diff": (logits - expected).abs().max().item(),
        "logits_max_abs": expected.abs().max().item(),
    }


def training_step(args):
    """The model of the checkpoint, its optimizer, and one training step of it on a fresh random
    batch (eager, or through `torch.compile` with `--compile`), which returns the loss and its
    wall time in seconds."""
    model = load(args.checkpoint, args.device)
    opt = optimizer(model)
    forward = torch.compile(model) if args.compile else model
    vocab, generator = model.config["vocab_size"], torch.Generator().manual_seed(2026)

    def step():
        start = time.perf_counter()
        ids = torch.randint(vocab, (2, args.batch, args.seq), generator=generator).to(args.device)
        logits = forward(ids[0])
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[1].reshape(-1))
        value = loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(args.device)
        return value, time.perf_counter() - start

    return step


def train(args, started):
    agreement = check_agreement(args)
    step = training_step(args)
    sync(args.device)
    startup_s = time.perf_counter() - started
    losses, step_s = zip(*[step() for _ in range(args.steps)]) if args.steps else ((), ())
    return {
        "sample": {
            "method": args.method,
            "startup_s": startup_s,
            "total_s": time.perf_counter() - started,
            "step_s": list(step_s),
            "peak_rss_bytes": peak_rss_bytes(),
            "device_in_use_bytes": torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
            "first_loss": losses[0] if losses else math.nan,
            "last_loss": losses[-1] if losses else math.nan,
        },
        "matmul": args.matmul,
        "mode": "compiled" if args.compile else "eager",
        **agreement,
    }


def serve(args):
    """Checks the logits, answers that it is ready, then runs one training step per `step` line
    read from stdin, answering each with its loss and seconds, until `quit` or the end of stdin:
    `haares-bench versus` alternates these steps with its own."""
    answer = check_agreement(args)
    step = training_step(args)
    print(RESULT_PREFIX + json.dumps({"ready": True, **answer}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        loss, seconds = step()
        print(RESULT_PREFIX + json.dumps({"loss": loss, "step_s": seconds}), flush=True)
    return None


def profile(args):
    """Where a steady eager step's time goes: the median forward (with the loss), backward and
    update of `steps` steps after `warmup`, then the same steps under torch.profiler, each
    operation's self CPU time and calls per step (the profiler's own overhead included)."""
    set_matmul_precision(args.matmul)
    model = load(args.checkpoint, args.device)
    opt = optimizer(model)
    vocab, generator = model.config["vocab_size"], torch.Generator().manual_seed(2026)

    def step():
        ids = torch.randint(vocab, (2, args.batch, args.seq), generator=generator).to(args.device)
        start = time.perf_counter()
        logits = model(ids[0])
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[1].reshape(-1))
        loss.item()
        forward_done = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync(args.device)
        backward_done = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(args.device)
        return [forward_done - start, backward_done - forward_done, time.perf_counter() - backward_done]

    for _ in range(args.warmup):
        step()
    phases = [step() for _ in range(args.steps)]
    median = lambda values: sorted(values)[len(values) // 2]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(args.steps):
            step()
    operations = [
        {"name": event.key, "self_s": event.self_cpu_time_total / 1e6 / args.steps,
         "calls": event.count / args.steps}
        for event in profiler.key_averages()
    ]
    operations.sort(key=lambda o: -o["self_s"])
    # By shape, each product timed on its own: under the profiler's `record_shapes` this step's
    # products took half as long again (`aten::mm` 304 → 470 ms a step on a 2-core host).
    products = timed_products(step, args.steps)
    return {"phase_s": [median([p[i] for p in phases]) for i in range(3)],
            "operations": operations, "products": products}


def timed_products(step, steps):
    """Runs `step` `steps` times, timing every matrix product in it (the backward pass's too) on
    its own: per shape, `matrices` products `[m, k] · [k, n]`, their seconds and calls per step.
    `TorchDispatchMode` is imported here, so that the other modes run on a PyTorch without it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    operands = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2)}  # addmm's first is the added term
    times = {}

    class ProductTimer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            at = operands.get(func.overloadpacket.__name__)
            if at is None:
                return func(*args, **(kwargs or {}))
            start = time.perf_counter()
            result = func(*args, **(kwargs or {}))
            seconds = time.perf_counter() - start
            lhs, rhs = args[at[0]].shape, args[at[1]].shape
            total = times.setdefault((lhs[0] if len(lhs) == 3 else 1, lhs[-2], lhs[-1], rhs[-1]),
                                     [0.0, 0])
            total[0] += seconds
            total[1] += 1
            return result

    with ProductTimer():
        for _ in range(steps):
            step()
    return [{"matrices": matrices, "m": m, "k": k, "n": n, "seconds": seconds / steps,
             "calls": calls / steps}
            for (matrices, m, k, n), (seconds, calls) in times.items()]


def main():
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["gemm", "train", "serve", "profile", "version"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--checkpoint")
    parser.add_argument("--check")
    parser.add_argument("--reference")
    parser.add_argument("--method", default="")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--matmul", choices=["fp32", "tf32"], default="fp32",
                        help="precision of f32 matrix products on CUDA (TF32 tensor cores or not)")
    parser.add_argument("--compile", action="store_true",
                        help="train through torch.compile(model) (TorchInductor)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "version":
        answer = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                  "interop_threads": torch.get_num_interop_threads(),
                  "cuda": torch.cuda.is_available()}
    elif args.mode == "gemm":
        answer = gemm(args)
    elif args.mode == "profile":
        answer = profile(args)
    elif args.mode == "serve":
        return serve(args)
    else:
        answer = train(args, started)
    print(RESULT_PREFIX + json.dumps(answer), flush=True)


if __name__ == "__main__":
    sys.exit(main())
