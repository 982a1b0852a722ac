"""What users actually measure, read into the planner's inputs: nccl-tests logs (`nccl`), `nvidia-smi topo -m`
output (`topo`), and their use from an instance's `cluster.network` (`network`). Hugging Face config.json files
are read by `formulation.inputs.model`. `summarize(path)` tells what a file is and what the planner takes from it.
"""

from formulation.inputs.ingest.nccl import LinkFit, NcclLog, fit_nccl_log, parse_nccl_log, sendrecv_pair_bandwidths
from formulation.inputs.ingest.summary import summarize
from formulation.inputs.ingest.topo import Topology, gpu_bandwidth_matrix, parse_topology

__all__ = ["LinkFit", "NcclLog", "Topology", "fit_nccl_log", "gpu_bandwidth_matrix",
           "parse_nccl_log", "parse_topology", "sendrecv_pair_bandwidths", "summarize"]
