#!/bin/bash
# radio-lit on several nodes without SLURM: torchrun with a c10d rendezvous. Run the same
# command on every node (from the repository root, with the run folder on storage every node
# sees); the first node to reach the rendezvous host serves it.
#
#   NNODES=4 RDZV_HOST=node0 RUN_ID=stage1-a launch/torchrun/multinode.sh configs/stage1.yaml
#   NNODES=2 NPROC_PER_NODE=1 RDZV_HOST=127.0.0.1 RUN_ID=try \
#     launch/torchrun/multinode.sh configs/quickstart.yaml --trainer.num_nodes 2 \
#     --trainer.strategy ddp            # on one machine: run it twice, two "nodes"
#
# NNODES x NPROC_PER_NODE must equal the config's trainer.num_nodes x trainer.devices (radio-lit
# refuses a mismatch before building anything). On SIGTERM (torchrun forwards it to every
# process) each rank stops after the same step, one checkpoint is written, and rank 0 prints the
# command that resumes (docs/clusters.md "On a cluster").
set -euo pipefail
config=$1
shift
exec torchrun --nnodes "${NNODES:?set NNODES}" --nproc_per_node "${NPROC_PER_NODE:-8}" \
  --rdzv_backend c10d --rdzv_endpoint "${RDZV_HOST:?set RDZV_HOST}:${RDZV_PORT:-29400}" \
  --rdzv_id "${RUN_ID:?set RUN_ID}" --no-python \
  radio-lit fit --config "$config" "$@"
