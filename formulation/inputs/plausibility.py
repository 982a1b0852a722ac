"""Plausibility warnings for the usual unit mistakes in an instance: bits for bytes, per-node for per-GPU
figures, both directions for one, algorithm for bus bandwidth, GB for GiB, sparse for dense TFLOP/s.

They are warnings, not errors: a value can be unusual and right. Each names the file, the field, what it
looks like and the figure a correct entry would have. Sources of the reference figures: NVIDIA data sheets
(NVLink per direction: V100 150 GB/s, A100 300, H100/H200 450, B200 900); InfiniBand NDR 400 Gb/s = 50 GB/s
and XDR 800 Gb/s = 100 GB/s per NIC; nccl-tests' busbw = algbw x 2(n-1)/n for all-reduce."""

from __future__ import annotations

from formulation.inputs.gpus import gpu_catalog

MAX_NIC_GB_PER_S = 100.0  # XDR 800 Gb/s, the fastest NIC one GPU drives today
NVLINK_GB_PER_S = {"v100": 150.0, "a100": 300.0, "h100": 450.0, "h200": 450.0, "b200": 900.0}
GIB_IN_GB = 2**30 / 1e9  # 1.074: a GB figure typed as GiB is 7.4% too large


def _nvlink_of(type_name: str, preset: str | None) -> float | None:
    """Per-direction NVLink figure of an SXM part, None for PCIe parts and unknown names."""
    text = f"{type_name} {preset or ''}".lower()
    if "pcie" in text:
        return None
    return next((bw for key, bw in NVLINK_GB_PER_S.items() if key in text), None)


def _network_warnings(network: dict, nvlink: list[float], where: str) -> list[str]:
    out = []
    inter, intra = network.get("inter_node_gb_per_s"), network.get("intra_node_gb_per_s")
    figures = [("cluster.network.inter_node_gb_per_s", inter)]
    figures += [(f"cluster.network.nodes[{i}].inter_node_gb_per_s", n.get("inter_node_gb_per_s"))
                for i, n in enumerate(network.get("nodes") or []) if isinstance(n, dict)]
    figures += [(f"cluster.network.node_pairs[{i}].gb_per_s", n.get("gb_per_s"))
                for i, n in enumerate(network.get("node_pairs") or []) if isinstance(n, dict)]
    for field, value in figures:
        if isinstance(value, (int, float)) and value > MAX_NIC_GB_PER_S:
            out.append(f"{where}: {field}: {value:g} GB/s per GPU is above any NIC (NDR 400 Gb/s = 50 GB/s, XDR "
                       f"800 Gb/s = 100 GB/s): Gb/s typed as GB/s ({value:g} Gb/s = {value / 8:g} GB/s), or a "
                       f"per-node figure (the field is per GPU and direction)?")
    if isinstance(intra, (int, float)) and isinstance(inter, (int, float)) and intra < inter:
        out.append(f"{where}: cluster.network.intra_node_gb_per_s: {intra:g} GB/s is below the inter-node "
                   f"{inter:g} GB/s: swapped figures?")
    elif isinstance(intra, (int, float)) and nvlink:
        peak = max(nvlink)
        if intra > 1.1 * peak:
            out.append(f"{where}: cluster.network.intra_node_gb_per_s: {intra:g} GB/s is above NVLink's {peak:g} "
                       f"GB/s per direction: a bidirectional figure ({2 * peak:g} GB/s both ways)?")
        elif intra < 0.5 * min(nvlink):
            out.append(f"{where}: cluster.network.intra_node_gb_per_s: {intra:g} GB/s is below half of NVLink's "
                       f"{min(nvlink):g} GB/s per direction: an algorithm bandwidth (nccl-tests busbw = algbw x "
                       f"2(n-1)/n) or a PCIe figure?")
    return out


def _gpu_type_warnings(name: str, data: dict, catalog: dict, where: str, precision: str) -> list[str]:
    out = []
    preset = data.get("preset", name if name in catalog else None)
    known = catalog.get(preset, {}) if isinstance(preset, str) else {}
    memory, peak = data.get("memory_gib"), data.get("peak_tflops")
    field = f"cluster.gpu_types.{name}"
    if isinstance(memory, (int, float)) and "memory_gib" in known and memory > 1.03 * known["memory_gib"]:
        out.append(f"{where}: {field}.memory_gib: {memory:g} exceeds the {preset}'s {known['memory_gib']:g} GiB: a "
                   f"GB figure? ({memory:g} GB = {memory / GIB_IN_GB:.1f} GiB)")
    fp8 = 2.0 if precision == "fp8" else 1.0  # the catalog's peaks are 16-bit; FP8 GEMMs run twice as fast
    if isinstance(peak, (int, float)) and "peak_tflops" in known and peak > 1.5 * fp8 * known["peak_tflops"]:
        out.append(f"{where}: {field}.peak_tflops: {peak:g} is far above the {preset}'s dense "
                   f"{known['peak_tflops']:g} TFLOP/s: a sparsity or FP8 figure? (the field is dense, at the "
                   f"training precision)")
    return out


def plausibility_warnings(data: dict, file: str) -> list[str]:
    """Warnings for an instance document that has passed validation (so its sections are well-formed)."""
    cluster = data.get("cluster") or {}
    catalog = gpu_catalog()
    gpu_types = cluster.get("gpu_types") or {}
    out = []
    for name, spec in gpu_types.items():
        out += _gpu_type_warnings(name, spec if isinstance(spec, dict) else {}, catalog, file,
                                  (data.get("training") or {}).get("precision", "bf16"))
    nvlink = [bw for name, spec in gpu_types.items()
              if (bw := _nvlink_of(name, (spec or {}).get("preset") if isinstance(spec, dict) else None))]
    return out + _network_warnings(cluster.get("network") or {}, nvlink, file)
