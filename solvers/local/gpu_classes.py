"""GPU classes the incremental scorer may treat as interchangeable: GPUs that no placement can tell apart by
any link they use, in either direction (so that swapping two of them never changes a score)."""

from __future__ import annotations


def safe_classes(cluster) -> list[int]:
    """Class id of every GPU: `uniform_classes`, with a class split into singletons unless every GPU outside
    it also sees its members identically (columns of the intra-node matrix), so directed sends are invariant."""
    class_of = [0] * cluster.num_gpus
    next_id = 0
    for members in cluster.uniform_classes():
        node = int(cluster.gpu_node[members[0]])
        M = cluster.intra_gb_per_s[node]
        local = [int(cluster.gpu_local[g]) for g in members]
        outside = [z for z in range(M.shape[0]) if z not in local]
        if len(members) > 1 and all(len({float(M[z, x]) for x in local}) == 1 for z in outside):
            for g in members:
                class_of[g] = next_id
            next_id += 1
        else:
            for g in members:
                class_of[g] = next_id
                next_id += 1
    return class_of
