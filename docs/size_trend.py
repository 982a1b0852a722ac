"""Do the held-out time residuals trend with model size? Per source, per stack and per cluster (source x GPU x
precision): the slope of log(predicted / measured) per doubling of the hidden size, of the per-GPU GEMM width
(hidden / tp, what the GEMMs' N and K are) and of the layer count, with Spearman's rho against the hidden size;
then the same pooled after removing each cluster's median (so that a source's level does not pass for a trend),
over all rows and over tp = 1 rows alone (no tensor-parallel communication that grows with tp); and the pair that
separates shape from stack: IBM fms-fsdp's and torchtitan's Llama-2-70B runs on A100 at the same per-GPU work.

    solve validate --json > validate.json      # leave-one-source-out predictions (about two minutes)
    python docs/size_trend.py validate.json    # the tables of docs/validation.md, "Model size"
"""

import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict

from formulation.evaluate import evaluate
from formulation.inputs.gpus import gpu_catalog
from solvers.validation import crossval

MIN_ROWS = 4  # a group needs this many runs and two hidden sizes to have a slope


def spearman(x: list[float], y: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for k, i in enumerate(order):
            out[i] = float(k)
        return out
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry)) / den if den else float("nan")


def slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of y on x (nan when x does not vary)."""
    mx, my = statistics.mean(x), statistics.mean(y)
    den = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / den if den else float("nan")


def records(predictions: list[dict]) -> list[dict]:
    runs = {r.row: r for r in crossval.reference_runs()}
    out = []
    for pred in predictions:
        run = runs[pred["row"]]
        model, job, p = run.instance.model, run.instance.training, run.placement
        out.append({"row": pred["row"], "family": pred["family"], "gpu": pred["gpu_type"],
                    "precision": pred["precision"], "stack": job.software_stack, "tp": p.tp,
                    "hidden": model.hidden_size, "layers": model.num_layers, "width": model.hidden_size / p.tp,
                    "log_residual": math.log(1 + pred["error"]), "model": pred["model"],
                    "measured_s": pred["measured_s"], "predicted_s": pred["predicted_s"], "error": pred["error"],
                    "compiled": job.torch_compile,
                    "tokens_per_gpu": p.micro_batch_size * job.seq_length / p.cp
                    * p.num_micro_batches(job.global_batch_size)})
    return out


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:+.1f}%"


def trend_row(label: str, xs: list[dict]) -> str:
    lr = [x["log_residual"] for x in xs]
    per = {key: slope([math.log2(x[key]) for x in xs], lr) for key in ("hidden", "width", "layers")}
    rho = spearman([x["hidden"] for x in xs], lr)
    return (f"| {label} | {len(xs)} | {min(x['hidden'] for x in xs)}-{max(x['hidden'] for x in xs)} | {rho:+.2f} | "
            f"{pct(per['hidden'])} | {pct(per['width'])} | {pct(per['layers'])} |")


def table(recs: list[dict], key, title: str) -> None:
    groups = defaultdict(list)
    for x in recs:
        groups[key(x)].append(x)
    print(f"\n{title}\n")
    print("| group | runs | hidden | rho(hidden) | per 2x hidden | per 2x hidden/tp | per 2x layers |")
    print("|---|---|---|---|---|---|---|")
    for name, xs in sorted(groups.items()):
        if len(xs) >= MIN_ROWS and len({x["hidden"] for x in xs}) > 1:
            print(trend_row(name if isinstance(name, str) else " / ".join(name), xs))


def centred(recs: list[dict]) -> None:
    clusters = defaultdict(list)
    for x in recs:
        clusters[(x["family"], x["gpu"], x["precision"])].append(x)
    rows = []
    for xs in clusters.values():
        if len(xs) >= 2:
            level = statistics.median(x["log_residual"] for x in xs)
            rows += [{**x, "log_residual": x["log_residual"] - level} for x in xs]
    print("\nPooled, each cluster's median removed (clusters of >= 2 runs)\n")
    print("| rows | runs | hidden | rho(hidden) | per 2x hidden | per 2x hidden/tp | per 2x layers |")
    print("|---|---|---|---|---|---|---|")
    fms = "IBM fms-fsdp"
    for label, sel in (("all", rows), ("all but fms-fsdp", [x for x in rows if x["family"] != fms]),
                       ("tp = 1", [x for x in rows if x["tp"] == 1]),
                       ("tp = 1 but fms-fsdp", [x for x in rows if x["tp"] == 1 and x["family"] != fms])):
        print(trend_row(label, sel))


def same_work_pair(recs: list[dict]) -> None:
    """fms-fsdp's and torchtitan's runs of one model on one GPU type at one per-GPU token count: the GEMM shapes,
    attention and elementwise work per GPU are the same, so a shape term moves both alike. Held out (each row
    with its own fold's fit) and with the stored calibration (one efficiency for both stacks' rows)."""
    print("\nSame model, GPU and per-GPU work across the two PyTorch stacks\n")
    print("| model | GPU | tokens per GPU | run | torch.compile | recompute | measured s | held out: predicted s "
          "| error | stored calibration: predicted s | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = {r.row: r for r in crossval.reference_runs()}
    keys = defaultdict(list)
    for x in recs:
        if x["family"] in ("IBM fms-fsdp", "torchtitan benchmarks") and x["precision"] == "bf16":
            name = x["model"].split(" (")[0]
            keys[(name, x["gpu"], x["tokens_per_gpu"])].append(x)
    for (name, gpu, tokens), xs in sorted(keys.items()):
        if len({x["family"] for x in xs}) < 2:
            continue
        for x in sorted(xs, key=lambda x: x["row"]):
            p = runs[x["row"]].placement
            ac = p.recompute + (f" ({p.recompute_num_layers} layers)" if p.recompute_num_layers else "")
            stored = evaluate(runs[x["row"]].instance, p).iteration_time_s
            stack = "fms-fsdp" if x["family"] == "IBM fms-fsdp" else "torchtitan"
            print(f"| {name} | {gpu} | {tokens:.0f} | {x['row']} ({stack}) | {'yes' if x['compiled'] else 'no'} | {ac} | "
                  f"{x['measured_s']:.2f} | {x['predicted_s']:.2f} | {pct(x['error'])} | "
                  f"{stored:.2f} | {pct(stored / x['measured_s'] - 1)} |")


def at_megatron_efficiency(recs: list[dict]) -> None:
    """The PyTorch stacks' A100 rows scored with the stored calibration and with Megatron-Core's A100 GEMM
    efficiency in place of their stack's (one row at a time, `matmul_efficiency` replaced in the instance)."""
    megatron = gpu_catalog("megatron")
    print("\nA100 rows of the PyTorch stacks at their stack's and at Megatron-Core's GEMM efficiency\n")
    print("| row | model | torch.compile | stored calibration | Megatron-Core's efficiency |")
    print("|---|---|---|---|---|")
    runs = {r.row: r for r in crossval.reference_runs()}
    for x in sorted(recs, key=lambda x: x["row"]):
        if x["gpu"] != "a100-sxm-80gb" or x["family"] not in ("IBM fms-fsdp", "torchtitan benchmarks"):
            continue
        run = runs[x["row"]]
        types = run.instance.cluster.gpu_types
        stored = evaluate(run.instance, run.placement).iteration_time_s
        saved = dict(types)
        for name, gpu in saved.items():
            types[name] = dataclasses.replace(gpu, matmul_efficiency=megatron[x["gpu"]]["matmul_efficiency"])
        swapped = evaluate(run.instance, run.placement).iteration_time_s
        types.update(saved)
        print(f"| {x['row']} | {x['model']} | {'yes' if x['compiled'] else 'no'} | "
              f"{pct(stored / x['measured_s'] - 1)} | {pct(swapped / x['measured_s'] - 1)} |")


def main(path: str) -> None:
    with open(path) as handle:
        recs = records(json.load(handle)["predictions"])
    table(recs, lambda x: x["family"], "Per source: slope of log(predicted / measured)")
    table(recs, lambda x: x["stack"], "Per stack")
    table(recs, lambda x: (x["family"], x["gpu"], x["precision"]), "Per cluster (source / GPU / precision)")
    centred(recs)
    same_work_pair(recs)
    at_megatron_efficiency(recs)


if __name__ == "__main__":
    main(sys.argv[1])
