#!/usr/bin/env bash
# gpu_session.sh OUTDIR -- one short device call: the GPU proof (issue 14) from binaries built here.
#
# A session is lent 15 minutes of device time, less than a CUDA build of the tree on the GPU machine
# plus the checks. So the binaries are built here (scripts/gpu_pack.sh: CUDA on, MPI off, stripped,
# xz) and carried in build-gpubin/; this script runs them against the machine's CUDA libraries (the
# toolkit's and PyTorch's wheels: cudart 13, cuBLASLt 13, NCCL 2, cuDNN 9), under one deadline
# (BUDGET_S, default 520 s) so that every log survives: each step gets min(its limit, time left).
# PARTS (default "tests speed e2e torch calibrate sanitizer"; also "profile") picks the groups.
# Logs and reports go to OUTDIR/logs.tgz (the device tool returns at most 8 files); a table of
# steps is printed last. Device tool: carry ["build-gpubin"], command `bash scripts/gpu_session.sh $OUT`.
set -u
out=${1:?"usage: scripts/gpu_session.sh OUTDIR"}
cd "$(dirname "$0")/.."
root=$(pwd)
w=/tmp/gpu_session
rm -rf "$w"; mkdir -p "$w/bin" "$w/logs" "$w/runs" "$out"
budget=${BUDGET_S:-520}
t0=$(date +%s)
export CTXPLAN_PROFILES="$root/profiles" PYTHONUNBUFFERED=1
left() { echo $((budget - ($(date +%s) - t0))); }
step() {  # step NAME LIMIT_S COMMAND...: logs to logs/NAME.log, records exit code and seconds
  local name=$1 lim=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then printf '%-28s SKIPPED (deadline)\n' "$name" | tee -a "$w/logs/steps.txt"; return 0; fi
  [ "$lim" -gt $((l - 12)) ] && lim=$((l - 12))
  local s; s=$(date +%s)
  timeout -k 5 "$lim" "$@" > "$w/logs/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-4s %4ss (limit %ss)\n' "$name" "$rc" $(($(date +%s) - s)) "$lim" | tee -a "$w/logs/steps.txt"
  return 0
}
pack() { tar -C "$w" -czf "$out/logs.tgz" logs runs 2>/dev/null; }
trap pack EXIT

tar -C "$w/bin" -xJf build-gpubin/bin.tar.xz || { echo "gpu_session: build-gpubin/bin.tar.xz missing (scripts/gpu_pack.sh, carry build-gpubin)"; exit 2; }
libs=""
for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libcudnn.so.9; do
  p=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/ /opt /usr/lib /usr/local/lib -name "$l" 2>/dev/null | head -1)
  echo "lib $l -> ${p:-NOT FOUND}" | tee -a "$w/logs/deps.log"
  [ -n "$p" ] && libs="$libs:$(dirname "$p")"
done
export LD_LIBRARY_PATH="${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$w"/bin/*; do ldd "$b" | grep 'not found' | sed "s|^|$(basename "$b"): |"; done | tee -a "$w/logs/deps.log"
B=$w/bin
step machine 20 bash -c 'nvidia-smi; nvidia-smi -L; nvcc --version; uname -a; nproc; free -g; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)"'
head -20 "$w/logs/machine.log"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu" in *H200*) base=h200-141gb; cl=1x1xh200 ;; *) base=h100-sxm-80gb; cl=1x1xh100 ;; esac

parts=" ${PARTS:-tests speed e2e torch calibrate sanitizer} "
has() { [[ "$parts" == *" $1 "* ]]; }
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if has tests; then
# 1. correctness: every gpu test (none may be skipped), the op cases against float64
step test_cuda_kernels 100 "$B/test_cuda_kernels" --gtest_brief=1
step test_backend_ops_gpu 80 "$B/test_backend_ops_gpu" --gtest_brief=1
step test_attention_cudnn 40 "$B/test_attention_cudnn" --gtest_brief=1
fi
if has speed; then
# 2. speed, side by side: our kernels (backend_ops perf) and PyTorch's (SDPA flash, torch.matmul)
# (host-side input generation dominates: 11 cases took 90 s on the first run, so it gets 200 s)
step backend_ops_perf 200 "$B/backend_ops" --backend cuda --mode perf --no-check
step torch_bench 80 python3 scripts/gpu_torch_ref.py bench "$w/runs/torch_bench.json"
fi
if has e2e; then
# 3. ctxrun end to end on the proof's single-GPU plans (scripts/gpu_models/plans.txt), CUDA backend
while IFS='|' read -r model seq plan <&3; do
  tag="$model-$seq-$(echo "$plan" | sed 's/[,=:]/_/g')"
  step "cuda-$tag" 40 "$B/ctxrun" --backend cuda --model "$model" --seq "$seq" --cluster "$cl" --plan "$plan" --steps 10 \
    --report "$w/runs/run-cuda-$tag.json"
done 3< <(grep -v '^#' scripts/gpu_models/plans.txt)
fi
if has torch; then
# 4. against PyTorch on the same weights and tokens: loss and gradient norm of step 1; tokens/s
step make_small 60 python3 scripts/gpu_torch_ref.py make "$w/small" small 8192
step cuda-small-8k-loss 60 "$B/ctxrun" --backend cuda --init-from "$w/small" --data "$w/small/tokens.bin" --seq 8192 \
  --cluster "$cl" --plan tp=1 --steps 1 --clip 0 --report "$w/runs/run-cuda-small-8k-loss.json"
step cuda-small-8k-fp32-loss 60 "$B/ctxrun" --backend cuda --init-from "$w/small" --data "$w/small/tokens.bin" --seq 8192 \
  --cluster "$cl" --plan tp=1,precision=fp32 --steps 1 --clip 0 --report "$w/runs/run-cuda-small-8k-fp32-loss.json"
step torch-small-8k-loss 60 python3 scripts/gpu_torch_ref.py loss "$w/small" 8192 "$w/runs/torch-small-8k-loss.json"
step cuda-small-8k-train 60 "$B/ctxrun" --backend cuda --init-from "$w/small" --data "$w/small/tokens.bin" --seq 8192 \
  --cluster "$cl" --plan tp=1 --steps 8 --report "$w/runs/run-cuda-small-8k-train.json"
step torch-small-8k-train 60 python3 scripts/gpu_torch_ref.py train "$w/small" 8192 6 "$w/runs/torch-small-8k-train.json"
step torch-small-8k-train-compile 150 python3 scripts/gpu_torch_ref.py train "$w/small" 8192 6 \
  "$w/runs/torch-small-8k-train-compile.json" compile
fi
if has calibrate; then
# 5. calibration (the measured profile the predictions use)
step calibrate 90 "$B/ctxrun-calibrate" --base "$base" --out "$w/runs/hardware-measured.json" --name "$base-measured"
fi
if has torch; then
step make_1b 80 python3 scripts/gpu_torch_ref.py make "$w/m1b" 1b 8192
step cuda-1b-8k-train 90 "$B/ctxrun" --backend cuda --init-from "$w/m1b" --data "$w/m1b/tokens.bin" --seq 8192 \
  --cluster "$cl" --plan tp=1 --steps 5 --report "$w/runs/run-cuda-1b-8k-train.json"
step torch-1b-8k-train 60 python3 scripts/gpu_torch_ref.py train "$w/m1b" 8192 5 "$w/runs/torch-1b-8k-train.json"
step torch-1b-8k-loss 60 python3 scripts/gpu_torch_ref.py loss "$w/m1b" 8192 "$w/runs/torch-1b-8k-loss.json"
fi
if has sanitizer; then
# 6. the memory checkers. NCCL's wheel probes kernels built for other GPUs at init
# (cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes, handled by NCCL): API errors are
# not reported, memory-access errors and races are.
step sanitizer_memcheck 60 "$san" --tool memcheck --report-api-errors no --error-exitcode 9 "$B/test_cuda_kernels" --gtest_brief=1
step sanitizer_racecheck 70 "$san" --tool racecheck --report-api-errors no --error-exitcode 9 "$B/test_backend_ops_gpu" \
  --gtest_brief=1 --gtest_filter='*attention*'
fi
if has profile; then
# 7. where a training step's time goes: every kernel of one step of a 4-layer head-dim-128 model at
# 8K tokens, timed by Nsight Compute (one metric, clocks left alone), summed per kernel name
step ncu_small_8k 80 "$ncu" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
  "$B/ctxrun" --backend cuda --model scripts/gpu_models/small-d128.json --seq 8192 --cluster "$cl" --plan tp=1 --steps 1
fi

echo "== failures"
for f in "$w"/logs/test_*.log "$w"/logs/sanitizer_*.log; do
  [ -f "$f" ] || continue
  echo "-- $(basename "$f"): $(grep -c 'Skipped' "$f") skipped; $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|ERROR SUMMARY' "$f" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$f" | head -12
done
echo "== steps"; cat "$w/logs/steps.txt"
