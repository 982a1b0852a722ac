"""Placement files (and a plan file's `placement`): read strictly, with the defaults README.md states, and checked
(formulation/placement.py `check_placement`); bad fields are one-line `InputError`s naming the file and field."""

from __future__ import annotations

from formulation.errors import Section
from formulation.inputs.frameworks import stack_schedules
from formulation.physics.schedules import FAMILIES
from formulation.inputs.job import RECOMPUTE_CHOICES, ZERO_STAGES
from formulation.placement import Placement, check_placement, even_split


def placement_from_dict(data: dict, instance, file: str) -> Placement:
    sec = Section(data, file, "")
    tp, pp = sec.integer("tp"), sec.integer("pp")
    cp, vpp = sec.integer("cp", default=1), sec.integer("vpp", default=1)
    dp = sec.integer("dp", default=None) or instance.cluster.num_gpus // (tp * pp * cp)
    if dp < 1:
        raise sec.error("dp", "tp x pp x cp exceeds the cluster")
    mbs = sec.integer("micro_batch_size", default=1)
    ep, etp = sec.integer("ep", default=1), sec.integer("etp", default=1)
    recompute = sec.string("recompute", default="none", choices=RECOMPUTE_CHOICES)
    recompute_num_layers = sec.integer("recompute_num_layers", default=0, minimum=0)
    a2a_overlap = sec.boolean("moe_a2a_overlap", default=False)
    schedule = sec.string("schedule", default="1f1b", choices=FAMILIES)
    dp_replicate = sec.integer("dp_replicate", default=1, minimum=1)
    reshard = sec.boolean("reshard_after_forward", default=True)
    if sec.has("zero_stage") and sec.data["zero_stage"] is None:  # null is not "leave it out"
        raise sec.error("zero_stage", f"expected one of {ZERO_STAGES}; got null (leave the field out for the "
                                      "default: 1 with distributed_optimizer true, else 0)")
    zero = sec.raw("zero_stage", None)
    dist_opt = sec.raw("distributed_optimizer", None)
    if dist_opt is not None and not isinstance(dist_opt, bool):
        raise sec.error("distributed_optimizer", "expected true or false")
    if zero is None:
        zero = 1 if dist_opt else 0
    if zero not in ZERO_STAGES or isinstance(zero, bool):  # before comparing: zero may be a string
        raise sec.error("zero_stage", f"expected one of {ZERO_STAGES}; got {zero!r}")
    zero = int(zero)  # 1.0 means 1, as for the other integer fields
    if dist_opt is not None and dist_opt != (zero >= 1):
        raise sec.error("distributed_optimizer", f"contradicts zero_stage={zero}")
    layers = sec.raw("layers_per_stage", None)
    if layers is None:
        layers = even_split(instance.model.num_layers, pp)
    elif not isinstance(layers, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in layers):
        raise sec.error("layers_per_stage", "expected a list of integers")
    gpus_raw = sec.raw("gpus", None)
    world = tp * pp * cp * dp
    if gpus_raw is None:
        gpus = tuple(range(world))
    else:
        if not isinstance(gpus_raw, list):
            raise sec.error("gpus", "expected a list of \"node:local_index\" strings")
        gpus = []
        for i, name in enumerate(gpus_raw):
            try:
                gpus.append(instance.cluster.gpu_index(str(name)))
            except KeyError:
                raise sec.error(f"gpus[{i}]", f"unknown GPU {name!r}; expected \"node:local_index\"") from None
        gpus = tuple(gpus)
    sec.done()
    placement = Placement(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, micro_batch_size=mbs, recompute=recompute,
                          zero_stage=zero, ep=ep, etp=etp, layers_per_stage=tuple(layers), gpus=gpus,
                          recompute_num_layers=recompute_num_layers, moe_a2a_overlap=a2a_overlap,
                          schedule=schedule, dp_replicate=dp_replicate, reshard_after_forward=reshard)
    check_placement(instance, placement, file)
    job = instance.training
    runs = stack_schedules(job.software_stack, job.torch_compile)
    if placement.pp > 1 and placement.schedule_name not in runs:  # never a schedule the stack cannot run
        raise sec.error("schedule", f"software_stack {job.software_stack} does not run {placement.schedule_name} "
                                    f"(it runs {', '.join(runs)}; docs/schedules.md)")
    return placement


def placement_from_document(data, instance, file: str) -> Placement:
    """A placement file's content (or a plan file's: its `placement`), with the defaults README.md states
    (`dp` the GPUs left, an even layer split, ranks filled node by node); bad fields are `InputError`s."""
    if isinstance(data, dict) and isinstance(data.get("placement"), dict):  # a plan file: take its placement
        data = data["placement"]
    return placement_from_dict(data, instance, file)


def load_placement(path, instance) -> Placement:
    from formulation.inputs.instance import read_document
    return placement_from_document(read_document(path), instance, str(path))


