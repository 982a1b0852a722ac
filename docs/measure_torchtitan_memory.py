"""The measurements behind `unfused_loss_buffers`, `compiled_loss` and `eager_working_memory` (docs/physics.md).

    python docs/measure_torchtitan_memory.py      # needs torch (a CPU build will do), not a project dependency

Counts, op by op, every storage that an eager op creates until it is freed (a TorchDispatchMode with a finalizer
per storage) while torchtitan 9dec370's Llama block and loss run forward and backward on CPU, in bf16, and prints
bytes per logit (the loss) and bytes per token x hidden size (the block). Compiled code allocates inside
Inductor's kernels, and DTensor's loss_parallel inside its op handlers, out of the dispatch mode's sight: for
those the script reads the process's resident high-water mark over one step (Linux), which gives the same 12
bytes per logit for the plain eager loss.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

H, HEADS, KV_HEADS, FFN, TOKENS, LAYERS, VOCAB = 512, 8, 2, 1792, 8192, 4, 32000  # f = 3.5 h, 4 q per kv as 8B
HEAD_DIM = H // HEADS
aten = torch.ops.aten
# torchtitan 9dec370 `_save_list` (parallelize_llama.py), with the CPU SDPA kernel added
SAVE_LIST = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_flash_attention_for_cpu.default, aten.abs.default, aten.max.default}


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops have created and that are still alive, and their peak."""

    def __init__(self, preexisting=()):
        super().__init__()
        self.current = self.peak = 0
        self.sizes = {t.untyped_storage().data_ptr(): 0 for t in preexisting}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in self.sizes or storage.nbytes() == 0:
                    continue
                self.sizes[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
                weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key):
        self.current -= self.sizes.pop(key, 0)


class RMSNorm(nn.Module):  # torchtitan 9dec370 models/norms.py (the non-fused default)
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


class Block(nn.Module):  # torchtitan 9dec370 models/llama/model.py, TransformerBlock
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(H, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, H, bias=False)
        self.w1, self.w3 = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(H), RMSNorm(H)

    def attention(self, x, freqs_cis):
        b, t, _ = x.shape
        q, k, v = (self.wq(x).view(b, t, -1, HEAD_DIM), self.wk(x).view(b, t, -1, HEAD_DIM),
                   self.wv(x).view(b, t, -1, HEAD_DIM))
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
        f = freqs_cis.view(1, t, 1, -1)
        q, k = torch.view_as_real(q_ * f).flatten(3).type_as(q), torch.view_as_real(k_ * f).flatten(3).type_as(k)
        rep = HEADS // KV_HEADS
        k = k.unsqueeze(3).expand(b, t, KV_HEADS, rep, HEAD_DIM).reshape(b, t, HEADS, HEAD_DIM)
        v = v.unsqueeze(3).expand(b, t, KV_HEADS, rep, HEAD_DIM).reshape(b, t, HEADS, HEAD_DIM)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, t, -1))

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


def op_level_policy():  # torchtitan 9dec370 `_apply_ac_to_transformer_block`, selective_ac_option "op"
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            counts[key] += 1
        save = func in SAVE_LIST and not (func == aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def block_memory(mode: str) -> tuple[float, float]:
    """(kept per layer, backward working set beyond what the layers keep), in bytes per token x h. Weights take
    gradients (so the GEMMs keep their inputs), each dropped as soon as it is accumulated: FSDP reduce-scatters
    each layer's, which the model counts among ZeRO-3's buffers."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(LAYERS)).to(torch.bfloat16)
    for weight in blocks.parameters():
        weight.register_post_accumulate_grad_hook(lambda w: setattr(w, "grad", None))
    freqs = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs_cis = torch.polar(torch.ones(TOKENS, HEAD_DIM // 2), torch.outer(torch.arange(TOKENS).float(), freqs))
    x = x0 = torch.randn(1, TOKENS, H, dtype=torch.bfloat16, requires_grad=True)
    unit = TOKENS * H
    with (tracker := LiveBytes([*blocks.parameters(), x0, freqs_cis])):
        for block in blocks:
            if mode == "op-level":
                x = checkpoint(block, x, freqs_cis, use_reentrant=False, context_fn=op_level_policy,
                               preserve_rng_state=False)
            elif mode == "full":
                x = checkpoint(block, x, freqs_cis, use_reentrant=False, preserve_rng_state=False)
            else:
                x = block(x, freqs_cis)
        kept = tracker.current
        x.sum().backward()
    return kept / LAYERS / unit, (tracker.peak - kept) / unit


def loss_memory(compiled: bool) -> float:
    """Peak bytes per logit of torchtitan 9dec370's step around the loss: output GEMM, cross entropy on
    `pred.float()`, `del pred`, backward (eager; compiled, what autograd saves)."""
    def loss_fn(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    h = torch.randn(1, TOKENS, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(VOCAB, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, TOKENS))
    logits = TOKENS * VOCAB
    if compiled:
        saved = []
        fn = torch.compile(loss_fn)
        pred = h @ w.t()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            fn(pred, labels)
        return sum(saved) / logits
    with (tracker := LiveBytes([h, w])):
        pred = h @ w.t()
        loss = loss_fn(pred, labels)
        del pred
        loss.backward()
    return tracker.peak / logits  # at the loss's backward, before the output GEMM's gradients exist


def high_water_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def _loss_high_water(rank: int, world: int, compiled: bool, result) -> None:
    """One rank of the output GEMM and loss with the vocabulary sharded over `world` processes (torchtitan's
    `loss_parallel` with a column-parallel output layer; plain PyTorch for world 1): the process's resident
    high-water mark over one step, from a reset taken after a warm-up, per local logit. Measures what a dispatch
    mode cannot see inside DTensor's handlers; Linux only (/proc/self/clear_refs)."""
    import contextlib
    import os
    import torch.distributed as dist
    tokens = 4 * TOKENS
    torch.manual_seed(0)
    h = torch.randn(1, tokens, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, tokens))
    out = nn.Linear(H, VOCAB, bias=False).to(torch.bfloat16)
    context = contextlib.nullcontext
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        parallelize_module(out, init_device_mesh("cpu", (world,)), ColwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False))
        context = loss_parallel

    def loss_fn(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    loss_of = torch.compile(loss_fn) if compiled else loss_fn

    def step():
        with context():
            pred = out(h)
            loss = loss_of(pred, labels)
            del pred
            loss.backward()
        for p in (h, *out.parameters()):
            p.grad = None
    step()  # warm-up: compilation, lazy buffers
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident size
    base = resident_bytes()
    step()
    if rank == 0:
        result.put((high_water_bytes() - base) / (tokens * VOCAB // world))
    if world > 1:
        dist.destroy_process_group()


def loss_high_water(world: int, compiled: bool) -> float:
    import torch.multiprocessing as mp
    result = mp.get_context("spawn").SimpleQueue()
    if world == 1:
        _loss_high_water(0, 1, compiled, result)
    else:
        mp.spawn(_loss_high_water, args=(world, compiled, result), nprocs=world)
    return result.get()


if __name__ == "__main__":
    for mode in ("op-level", "full", "none"):
        kept, working = block_memory(mode)
        print(f"block, {mode} checkpointing: kept {kept:.2f}, backward working set {working:.2f} bytes per token x h")
    print(f"loss, eager: peak {loss_memory(False):.2f} bytes per logit")
    print(f"loss, compiled: {loss_memory(True):.2f} bytes per logit saved for the backward")
    for world in (1, 2):
        for compiled in (False, True):
            print(f"loss, {'compiled' if compiled else 'eager'}, vocabulary over {world} process(es): resident "
                  f"high-water {loss_high_water(world, compiled):.2f} bytes per local logit")
