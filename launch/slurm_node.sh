#!/usr/bin/env bash
# One node of a multi-node rlcore run: torchrun, with its rendezvous taken from Slurm's environment.
# launch/slurm.sbatch starts one of these per node (srun --ntasks-per-node 1); by hand, on each node:
#
#   SLURM_JOB_ID=7 SLURM_NNODES=2 SLURM_NODEID=0 SLURM_JOB_NODELIST=host1,host2 launch/slurm_node.sh recipe=demo
#
# Reads: SLURM_JOB_ID (rendezvous id), SLURM_NNODES, SLURM_NODEID (0 hosts the rendezvous store),
# SLURM_JOB_NODELIST (the head node is its first host; expanded by scontrol, or a plain comma list
# where scontrol is missing), GPUs per node from SLURM_GPUS_ON_NODE (else nvidia-smi; at least 1 rank).
# Optional: RLCORE_RDZV_PORT (29500), RLCORE_SHUTDOWN_TIMEOUT (170 s: how long torchrun lets ranks finish
# the step and checkpoint after a signal before it SIGKILLs them), PYTHON (python).
# Arguments go to launch/train.py after resume=auto, so a requeued job continues (and resume=PATH wins).
# Exits with launch/train.py's code on this node (75 = preempted, requeue), not torchrun's blanket 1.
set -uo pipefail
cd "$(dirname "$0")/.."

if command -v scontrol >/dev/null 2>&1; then
    head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
else
    head_node=${SLURM_JOB_NODELIST%%,*}
fi
gpus=${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "${gpus:-0}" -gt 0 ] 2>/dev/null || gpus=1
is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0)
status=$(mktemp)

# Slurm signals every process of the step's process group: torchrun forwards SIGTERM / SIGUSR1 to
# its ranks (which finish the step and checkpoint); this shell only has to outlive it.
trap ':' TERM USR1
RLCORE_EXIT_CODE_FILE=$status "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes "$SLURM_NNODES" --nproc-per-node "$gpus" \
    --rdzv-backend c10d --rdzv-endpoint "$head_node:${RLCORE_RDZV_PORT:-29500}" --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-conf "is_host=$is_host" \
    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    --shutdown-timeout "${RLCORE_SHUTDOWN_TIMEOUT:-170}" \
    launch/train.py resume=auto "$@" &
pid=$!
while :; do
    wait "$pid"; code=$?
    kill -0 "$pid" 2>/dev/null || break  # a trapped signal interrupted the wait: keep waiting
done
if [ -s "$status" ]; then code=$(cat "$status"); fi
rm -f "$status"
exit "$code"
