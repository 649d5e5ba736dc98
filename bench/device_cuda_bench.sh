#!/usr/bin/env bash
# One device call on the GPU machine (1x H200, 16 cores, torch with CUDA, timm): the benchmarks
# with CUDA tensors in an emulated cluster of HOSTS (4) hosts at RATE (5gbit), every rank on the
# same GPU (rank r uses cuda device LOCAL_RANK % device_count = 0). Builds the extension in place,
# brings the cluster up with the bundled ip/tc (bench/bundle_iproute.sh -> .tools/iproute, carried
# along), measures goodput, runs the stages, and always leaves bench/results/device-cuda-<date>/
# as one tarball in $OUT (the device tool's return folder), the cluster torn down.
#
#   bash bench/device_cuda_bench.sh                    # STAGES="ddp overlap collectives"
#   STAGES=ddp DDP_ARGS="--steps 4" bash bench/device_cuda_bench.sh
#
# Stages (STAGES, in order):
#   ddp             ViT-B/16 (timm's vit_base_patch16_224 when timm imports, else the built-in one
#                   of the same shape; DDP_MODEL picks another), batch 32/rank, fp32, --device cuda:
#                   compute only, DDP over each backend, the manual staged reducer; 2 warm-up + 8
#                   timed steps; DDP_ARGS adds options
#   overlap         18 x 25 MiB buckets on the GPU, all-reduced there; backward longer than the
#                   communication (a 25 MiB all-reduce on 4 hosts at 5 Gbit/s takes about 63 ms;
#                   the compute per bucket is calibrated to 80 ms of 4096^2 matmuls on rank 0
#                   alone, and the ranks share the GPU, so it runs longer when they compute at
#                   once: 2.2x the calibration with 2 ranks on the H200); OVERLAP_ARGS replaces
#                   those options
#   overlap-staged  the same with --stage-to-cpu (buckets copied to CPU tensors first: the old way)
#   collectives     all_reduce, all_gather, broadcast of CUDA tensors, 1 KiB .. 64 MiB (x4 steps),
#                   busbw against the measured goodput; COLL_ARGS adds options
# Environment: HOSTS (4), RATE (5gbit), BACKENDS (mccl,gloo), CPUS_PER_HOST (pin each host to that
# many CPUs of its own, mccl.cluster up --cpus-per-host), DEADLINE (seconds per stage, 600: every rank
# is killed after it, so a hung collective costs one stage, not the call; the ddp stage also prints
# the variant, step and Python stacks of a rank whose step takes over 120 s).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
RES=bench/results/device-cuda-$(date +%Y%m%d-%H%M%S); mkdir -p "$RES"
export PYTHONPATH=$PWD/python IPROUTE_DIR=$PWD/.tools/iproute PYTHONUNBUFFERED=1
BACKENDS=${BACKENDS:-mccl,gloo}
cl() { python3 -m mccl.cluster --iproute-dir "$IPROUTE_DIR" "$@"; }
trap 'cl down --id x0 >/dev/null 2>&1; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
{ echo "# $(date -Is) $(uname -srm), $(nproc) CPUs, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  python3 -c "import timm; print('timm', timm.__version__)" || echo "timm: not importable (ddp uses the built-in ViT-B/16)"
} > "$RES/env.txt" 2>&1
cat "$RES/env.txt"
cl down --id x0 >/dev/null 2>&1
cl up --id x0 --hosts "${HOSTS:-4}" --rate "${RATE:-5gbit}" ${CPUS_PER_HOST:+--cpus-per-host $CPUS_PER_HOST} \
  > "$RES/cluster.txt" 2>&1 || { cat "$RES/cluster.txt"; exit 1; }
cl goodput --id x0 --seconds 5 | tee -a "$RES/cluster.txt"
GP=$(grep -o '[0-9.]* Gbit/s' "$RES/cluster.txt" | head -1 | cut -d' ' -f1)gbit
[ "$GP" = gbit ] && GP=measure  # no figure in the cluster tool's output: the ranks measure it themselves
B="python3 -m mccl.bench"
D="--deadline ${DEADLINE:-600}"
OVERLAP_DEFAULT="--buckets 18 --bucket-mb 25 --compute-ms 80 --matmul 4096 --steps 5 --warmup-steps 1"
for st in ${STAGES:-ddp overlap collectives}; do
  echo "=== $st $(date +%T)"
  case $st in
    ddp) $B ddp --cluster x0 $D --backends "$BACKENDS" --device cuda ${DDP_MODEL:+--model $DDP_MODEL} --batch 32 \
           --bucket-mb 25 --warmup-steps 2 --steps 8 --step-timeout 120 ${DDP_ARGS:-} \
           --json "$RES/ddp.json" --plot "$RES/ddp.png" > "$RES/ddp.txt" 2>&1 ;;
    overlap) $B overlap --cluster x0 $D --backends "$BACKENDS" --device cuda ${OVERLAP_ARGS:-$OVERLAP_DEFAULT} \
           --json "$RES/overlap.json" --plot "$RES/overlap.png" > "$RES/overlap.txt" 2>&1 ;;
    overlap-staged) $B overlap --cluster x0 $D --backends "$BACKENDS" --device cuda --stage-to-cpu \
           ${OVERLAP_ARGS:-$OVERLAP_DEFAULT} \
           --json "$RES/overlap-staged.json" --plot "$RES/overlap-staged.png" > "$RES/overlap-staged.txt" 2>&1 ;;
    collectives) $B --cluster x0 $D --backends "$BACKENDS" --device cuda --goodput "$GP" \
           --ops all_reduce,all_gather,broadcast -b 1K -e 64M -f 4 ${COLL_ARGS:-} \
           --json "$RES/collectives.json" --plot "$RES/collectives.png" > "$RES/collectives.txt" 2>&1 ;;
    *) echo "device_cuda_bench.sh: unknown stage '$st'" >&2; continue ;;
  esac
  echo "=== $st: exit $? $(date +%T)" | tee -a "$RES/$st.txt"
  tail -n 12 "$RES/$st.txt"
done
