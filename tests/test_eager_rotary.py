"""The eager rotary embedding's memory traffic (docs/physics.md `eager_elementwise`): counted op by op while the two
implementations run in bf16 on CPU, against the 16-bit passes per Q/K element the model charges
(formulation/physics/cost.py EAGER_ROTARY_UNITS)."""

from __future__ import annotations

import pytest

from conftest import build_instance, small_instance_dict
from formulation import InputError
from formulation.physics import cost
from formulation.placement import Placement

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

BATCH, TOKENS, HEADS, HEAD_DIM = 1, 256, 32, 64


class Traffic(TorchDispatchMode):
    """Bytes each op reads and writes: every tensor argument (an input broadcast over heads counts once, its
    storage) and every output that is not a view of an input (views and reshapes move nothing)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        written = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
                   and t.untyped_storage().data_ptr() not in storages]
        if written:  # a view or in-place reshape reads nothing either
            self.bytes += sum(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()) for t in inputs)
            self.bytes += sum(t.numel() * t.element_size() for t in written)
        return out


def complex_rotary(q, freqs_cis):
    """Meta's Llama / torchtitan apply_rotary_emb: fp32 complex views, one complex multiply, downcast."""
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    return torch.view_as_real(q_ * freqs_cis[None, :, None, :]).flatten(3).type_as(q)


def rotation_matrix_rotary(q, rotations):
    """The same rotation as IBM fms's RotaryEmbedding: each (x, y) pair times its fp32 2x2 matrix, summed."""
    q_ = q.float().view(*q.shape[:-1], -1, 2)
    return rotations[None, :, None].mul(q_.unsqueeze(-2)).sum(5).flatten(3).type_as(q)


def units(rotate, table) -> float:
    q = torch.randn(BATCH, TOKENS, HEADS, HEAD_DIM).to(torch.bfloat16)
    with torch.no_grad(), Traffic() as traffic:
        rotate(q, table)
    return traffic.bytes / (2.0 * q.numel())


def tables():
    angles = torch.outer(torch.arange(TOKENS, dtype=torch.float32), torch.rand(HEAD_DIM // 2))
    rotations = torch.stack([angles.cos(), -angles.sin(), angles.sin(), angles.cos()], dim=2).view(*angles.shape, 2, 2)
    return torch.polar(torch.ones_like(angles), angles), rotations


def test_eager_rotary_units_match_counted_traffic():
    """Counted: 10.0 passes (complex) and 18.0 (rotation matrices), within the few per cent the per-token angle
    tables add at 32 heads."""
    freqs_cis, rotations = tables()
    q = torch.randn(BATCH, TOKENS, HEADS, HEAD_DIM).to(torch.bfloat16)
    assert torch.allclose(complex_rotary(q, freqs_cis).float(), rotation_matrix_rotary(q, rotations).float(),
                          atol=0.05)  # the same rotation
    assert units(complex_rotary, freqs_cis) == pytest.approx(cost.EAGER_ROTARY_UNITS["complex"], rel=0.05)
    assert units(rotation_matrix_rotary, rotations) == pytest.approx(cost.EAGER_ROTARY_UNITS["rotation_matrix"],
                                                                     rel=0.05)


def test_rotary_impl_changes_eager_cost_only():
    """The rotation-matrix code costs 8 more passes per Q/K element than the complex one eager, nothing compiled."""
    data = small_instance_dict()
    data["training"].update(software_stack="torchtitan", torch_compile=False)
    p = Placement(tp=1, pp=1, cp=1, dp=8, vpp=1, micro_batch_size=1, recompute="none", zero_stage=1,
                  layers_per_stage=(8,), gpus=tuple(range(8)))
    inst = build_instance(data)
    model, job = inst.model, inst.training
    qk = 1 + model.num_kv_heads / model.num_attention_heads
    complex_bytes = cost.elementwise_bytes(model, job, p)
    data["training"]["rotary_impl"] = "rotation_matrix"
    matrix_job = build_instance(data).training
    extra = 2.0 * job.seq_length * model.hidden_size * 8.0 * qk
    assert cost.elementwise_bytes(model, matrix_job, p) - complex_bytes == pytest.approx(extra, rel=1e-9)
    data["training"]["torch_compile"] = True
    compiled = build_instance(data).training
    data["training"]["rotary_impl"] = "complex"
    assert cost.elementwise_bytes(model, compiled, p) == cost.elementwise_bytes(model, build_instance(data).training, p)


def test_unknown_rotary_impl_names_the_field():
    data = small_instance_dict()
    data["training"]["rotary_impl"] = "quaternion"
    with pytest.raises(InputError, match=r"training\.rotary_impl"):
        build_instance(data)
