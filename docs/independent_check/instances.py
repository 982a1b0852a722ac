"""Random tiny clusters for the independent check (check_b5.py): eight kinds, seeded by name."""
import itertools
import random
import zlib

KINDS = ["mixed", "mixed_tight", "uneven", "oneway_nodes", "slow", "moe", "moe_mixed", "vpp_cp_z3"]


def model(rng, layers=None, moe=False):
    hidden = rng.choice([512, 1024, 2048])
    L = layers or rng.choice([2, 3, 4, 5])
    m = {"name": "tiny", "num_hidden_layers": L, "hidden_size": hidden, "intermediate_size": 3 * hidden,
         "num_attention_heads": 8, "num_key_value_heads": rng.choice([2, 4, 8]), "vocab_size": rng.choice([4096, 32000]),
         "hidden_act": "silu"}
    if moe:
        m["num_experts_per_tok"] = 2
        if rng.random() < 0.6:
            m["num_local_experts"] = rng.choice([2, 4])
            m["intermediate_size"] = 2 * hidden
        else:
            m.update({"n_routed_experts": 4, "moe_intermediate_size": hidden, "n_shared_experts": 1,
                      "first_k_dense_replace": 1})
    return m


def training(rng, **kw):
    t = {"global_batch_size": rng.choice([2, 4, 6, 8]), "seq_length": rng.choice([512, 1024, 2048, 4096]),
         "precision": "bf16", "recompute": rng.sample(["none", "selective", "full"], 2),
         "zero_stage": rng.sample([0, 1, 3], 2), "max_micro_batch_size": rng.choice([1, 2]),
         "context_parallel_sizes": rng.choice([[1], [1, 2]]), "virtual_pipeline_sizes": rng.choice([[1], [1, 2]])}
    t.update(kw)
    return t


TYPES = ["h100-sxm-80gb", "a100-sxm-40gb", "a100-sxm-80gb", "v100-sxm-32gb", "h200-sxm-141gb", "h100-pcie-80gb"]


def make(kind, seed):
    rng = random.Random(zlib.crc32(f"{kind}-{seed}".encode()))
    net = {"intra_node_gb_per_s": rng.choice([100.0, 300.0, 450.0]), "inter_node_gb_per_s": rng.choice([5.0, 12.0, 25.0, 48.0])}
    types = {}
    if kind in ("mixed", "mixed_tight", "moe_mixed"):
        shape = rng.choice([(2, 2), (1, 3), (3, 1), (2, 1, 1), (1, 1, 2), (2, 4), (4, 2), (1, 2, 1), (2, 2, 2)])
        tnames = rng.sample(TYPES, 2 if len(shape) < 3 or rng.random() < 0.5 else 3)
        ntypes = [tnames[i % len(tnames)] if i < len(tnames) else rng.choice(tnames) for i in range(len(shape))]
        rng.shuffle(ntypes)
        if len(set(ntypes)) == 1:
            ntypes[0] = [t for t in tnames if t != ntypes[1]][0]
        nodes = [{"name": f"n{i}", "gpu_type": t, "gpus": g} for i, (g, t) in enumerate(zip(shape, ntypes))]
        for t in set(ntypes):
            types[t] = {}
        net["nodes"] = [{"node": f"n{i}", "intra_node_gb_per_s": rng.choice([100.0, 200.0, 400.0]),
                         "inter_node_gb_per_s": rng.choice([6.0, 24.0, 48.0])} for i in range(len(shape))]
        if kind == "mixed_tight":
            for t in types:
                types[t] = {"memory_gib": round(rng.uniform(3.0, 9.0), 1), "runtime_overhead_gib": 1.0}
    else:
        if kind in ("uneven", "slow", "vpp_cp_z3"):
            shape = rng.choice([(3, 5), (1, 2, 3), (3, 3), (2, 3), (1, 4), (5, 3), (2, 2, 2), (3, 1)])
        elif kind == "oneway_nodes":
            shape = rng.choice([(1, 2, 3), (2, 3), (3, 2, 1), (2, 2, 2), (4, 2), (1, 1, 2)])
        else:  # moe
            shape = rng.choice([(2, 2), (1, 3), (2, 4), (3, 1), (2, 1, 1)])
        t = rng.choice(TYPES[:3])
        types[t] = {}
        nodes = [{"name": f"n{i}", "gpu_type": t, "gpus": g} for i, g in enumerate(shape)]
        if kind == "oneway_nodes":
            k = len(shape)
            mat = [[0.0] * k for _ in range(k)]
            for i, j in itertools.combinations(range(k), 2):
                a = round(rng.uniform(3, 50), 1)
                b = round(rng.uniform(1, a), 1) if rng.random() < 0.7 else a
                mat[i][j], mat[j][i] = (a, b) if rng.random() < 0.5 else (b, a)
            net["node_matrix_gb_per_s"] = mat
            net["nodes"] = [{"node": f"n{i}", "intra_node_gb_per_s": rng.choice([80.0, 300.0])} for i in range(k)]
        if kind == "slow":
            net["inter_node_gb_per_s"] = rng.choice([0.2, 0.5, 1.0])
            net["intra_node_gb_per_s"] = rng.choice([2.0, 10.0, 400.0])
        if rng.random() < 0.4:
            for t in types:
                types[t] = {"memory_gib": round(rng.uniform(3.0, 9.0), 1), "runtime_overhead_gib": 1.0}
    moe = kind.startswith("moe")
    tr = training(rng)
    if kind == "vpp_cp_z3":
        tr.update(zero_stage=[3] + rng.sample([0, 1], 1), context_parallel_sizes=[1, 2], virtual_pipeline_sizes=[1, 2],
                  recompute=rng.sample(["none", "selective", "full"], 1))
    if moe:
        tr["zero_stage"] = rng.sample([0, 1], 1)
        tr["expert_tensor_parallel_sizes"] = rng.choice([[1], [1, 2]])
        tr["moe_token_dispatcher"] = rng.choice(["alltoall", "allgather"])
        tr["context_parallel_sizes"] = [1]
    # keep brute force small
    world = sum(n["gpus"] for n in nodes)
    L = rng.choice([2, 3, 4, 5] if world <= 6 else [2, 3, 4])
    if world >= 8:
        tr["max_micro_batch_size"] = 1
        tr["recompute"] = tr["recompute"][:1] if rng.random() < 0.5 else tr["recompute"]
    return {"name": f"{kind}{seed}", "model": model(rng, L, moe), "training": tr,
            "cluster": {"gpu_types": types, "nodes": nodes, "network": net}}
