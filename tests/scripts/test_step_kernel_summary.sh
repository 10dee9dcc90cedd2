#!/usr/bin/env bash
# scripts/step_kernel_summary.py on a kernel summary shaped as nsys 2025 prints it (lines before
# the CSV): each kind's milliseconds a step, the limits' shares, the idle time against the
# step's wall time; on Nsight Compute's per-launch CSV (the profiler's and the program's lines
# before it, thousands separators, mixed units) beside a PyTorch-named run, kind by kind, and
# each run's first step in launch order (--order); text
# that is no summary, --steps 0 and --beside without its steps refused. scripts/profile-step.sh
# refuses a build folder without ddptrain and an unknown PROFILER, and says it is skipped where
# no profiler is.
# Usage: test_step_kernel_summary.sh BUILD_DIR
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
source "$(dirname "$0")/check_lib.sh"
has() { grep -qF -- "$1" "$2" || { echo "FAILED: no '$1' in:"; cat "$2"; failed=1; }; }
cat > "$work/k.csv" <<'CSV'
Processing [/tmp/p.sqlite] with [/opt/nvidia/nsight-systems/2025.3/reports/cuda_gpu_kern_sum.py]...

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
60.0,6000000,30,200000.0,200000.0,190000,210000,100.0,"nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
20.0,2000000,10,200000.0,200000.0,190000,210000,100.0,"void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(T1::Params)"
10.0,1000000,10,100000.0,100000.0,90000,110000,100.0,"void ddp::(anonymous namespace)::sgd_kernel<(bool)1>(float *, float *, const float *, long)"
5.0,500000,10,50000.0,50000.0,40000,60000,100.0,"void ddp::(anonymous namespace)::to_bf16_kernel(const float *, __nv_bfloat16 *, long)"
3.0,300000,20,15000.0,15000.0,14000,16000,100.0,"void ddp::(anonymous namespace)::relu_mask_kernel(float *, const float *, long)"
2.0,200000,10,20000.0,20000.0,20000,20000,0.0,"void ddp::increment_kernel(long *)"
CSV
echo '{"precision": "bf16", "limit_products_ms": 0.7, "limit_optimizer_ms": 0.12, "limit_ms": 0.82}' > "$work/l.json"
"$py" "$root/scripts/step_kernel_summary.py" "$work/k.csv" --steps 10 --step-ms 1.25 --limits "$work/l.json" > "$work/out.md" ||
  { rc=$?; cat "$work/out.md"; echo "FAILED: the summary exited $rc"; exit 1; }
cat "$work/out.md"
has "| products (cuBLASLt) | 2 | 4.0 | 0.800 | 80 % | 0.700 | 88 % |" "$work/out.md"
# In bf16 the optimizer's limit holds the bf16 copy: 0.12 ms over 0.100 + 0.050 ms.
has "| optimizer | 1 | 1.0 | 0.100 | 10 % | 0.120 | 80 % |" "$work/out.md"
has "| bias and ReLU masks | 1 | 2.0 | 0.030 | 3 % | - | - |" "$work/out.md"
has "| all kernels | 6 | 9.0 | 1.000 | 100 % | 0.820 | 82 % |" "$work/out.md"
has "step 1.250 ms, its kernels 1.000 ms: 0.250 ms (20 %) with the GPU idle" "$work/out.md"
has "- 0.600 ms, 3.0 a step, 200.0 us each [products (cuBLASLt)]: nvjet_tst_256x128" "$work/out.md"
# Nsight Compute: one row per launch and metric; 2 steps.
hdr='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
row() { echo "\"$1\",\"7\",\"ddptrain\",\"h\",\"$2\",\"1\",\"7\",\"(256, 1, 1)\",\"(8, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"$3\",\"$4\",\"$5\""; }
{
  echo "==PROF== Connected to process 7 (ddptrain)"
  echo "[info] --profile-steps 301-302: the CUDA profiler's capture range opens before step 301"
  echo "$hdr"
  row 0 nvjet_tst_128x256_64x4_2x1_v_bz_TNT gpu__time_duration.sum nsecond "1,000,000"
  row 1 nvjet_tst_128x256_64x4_2x1_v_bz_TNT gpu__time_duration.sum usecond "1,000"
  row 2 "void ddp::(anonymous namespace)::sgd_kernel<(bool)1>(float *, float *, const float *, long)" gpu__time_duration.sum nsecond "200,000"
  row 2 "void ddp::(anonymous namespace)::sgd_kernel<(bool)1>(float *, float *, const float *, long)" sm__throughput.avg.pct_of_peak_sustained_elapsed % "80"
  row 3 "void ddp::(anonymous namespace)::sgd_kernel<(bool)1>(float *, float *, const float *, long)" gpu__time_duration.sum nsecond "200,000"
  echo "==PROF== Disconnected from process 7"
} > "$work/ddp.csv"
{
  echo "$hdr"
  row 0 nvjet_tst_128x256_64x4_2x1_v_bz_TNT gpu__time_duration.sum nsecond "900,000"
  row 1 "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor<float, 2>>(...)" gpu__time_duration.sum nsecond "50,000"
  row 2 "void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>>(...)" gpu__time_duration.sum nsecond "30,000"
} > "$work/torch.csv"
"$py" "$root/scripts/step_kernel_summary.py" "$work/ddp.csv" --steps 2 --step-ms 1.5 --order \
  --beside "$work/torch.csv" --beside-steps 1 --beside-step-ms 1.0 --beside-name "PyTorch graph" > "$work/ncu.md" ||
  { rc=$?; cat "$work/ncu.md"; echo "FAILED: the summary of ncu's CSV exited $rc"; exit 1; }
cat "$work/ncu.md"
has "| products (cuBLASLt) | 1 | 1.0 | 1.000 | 83 % | - | - |" "$work/ncu.md"
has "| optimizer | 1 | 1.0 | 0.200 | 17 % | - | - |" "$work/ncu.md"
has "| kind | ddptrain | PyTorch graph | ddptrain - PyTorch graph |" "$work/ncu.md"
has "| products (cuBLASLt) | 1.000 (1.0) | 0.900 (1.0) | +0.100 |" "$work/ncu.md"
has "| optimizer | 0.200 (1.0) | 0.050 (1.0) | +0.150 |" "$work/ncu.md"
has "| bias and ReLU masks | 0.000 (0.0) | 0.030 (1.0) | -0.030 |" "$work/ncu.md"
has "| all kernels | 1.200 (2.0) | 0.980 (3.0) | +0.220 |" "$work/ncu.md"
has "| outside the kernels | 0.300 | 0.020 | +0.280 |" "$work/ncu.md"
# --order: the first of the 2 steps is launches 0 and 1 (both products, in ns and in us), the
# optimizer's launches 2 and 3 the second's (launch 2's other metric row is no time); then
# PyTorch's one step.
has "ddptrain's first step, kernel by kernel in launch order (2 a step):" "$work/ncu.md"
has "| 1 | 1000.0 | products (cuBLASLt) | nvjet_tst_128x256_64x4_2x1_v_bz_TNT |" "$work/ncu.md"
has "| 2 | 1000.0 | products (cuBLASLt) | nvjet_tst_128x256_64x4_2x1_v_bz_TNT |" "$work/ncu.md"
check test "$(grep -c '^| [0-9] | [0-9.]* | optimizer |' "$work/ncu.md")" -eq 1  # PyTorch's
check test "$(grep -c '^| 3 |' "$work/ncu.md")" -eq 1  # PyTorch's third; ddptrain's step has 2
has "PyTorch graph's first step, kernel by kernel in launch order (3 a step):" "$work/ncu.md"
has "| 3 | 30.0 | bias and ReLU masks |" "$work/ncu.md"
# cuBLASLt's BGRADB epilogue kernel is a bias-gradient reduction, not "other".
{ echo "$hdr"; row 0 "void epilogue::globalKernelBgradAB_v1<16, 16, float, float, float>(int)" \
    gpu__time_duration.sum nsecond "2,700"; } > "$work/bgrad.csv"
"$py" "$root/scripts/step_kernel_summary.py" "$work/bgrad.csv" --steps 1 > "$work/bgrad.md"
has "| reductions (bias gradients) | 1 | 1.0 | 0.003 | 100 % | - | - |" "$work/bgrad.md"
check bash -c "! '$py' '$root/scripts/step_kernel_summary.py' '$work/ddp.csv' --steps 2 --beside '$work/torch.csv' 2> '$work/beside.err'"
has "--beside: give --beside-steps too" "$work/beside.err"
echo "not a summary" > "$work/bad.csv"
check bash -c "! '$py' '$root/scripts/step_kernel_summary.py' '$work/bad.csv' --steps 10 2> '$work/bad.err'"
has "no kernel summary here" "$work/bad.err"
check bash -c "! '$py' '$root/scripts/step_kernel_summary.py' '$work/k.csv' --steps 0 2> '$work/zero.err'"
has "--steps 0: expected at least 1" "$work/zero.err"
bash "$root/scripts/profile-step.sh" "$work/nothing" > "$work/p.out" 2>&1
check test $? = 2
has "BUILD_DIR $work/nothing: no bin/ddptrain there" "$work/p.out"
if [ -x "$1/bin/ddptrain" ]; then
  PROFILER=vtune bash "$root/scripts/profile-step.sh" "$1" > "$work/p.out" 2>&1
  check test $? = 2
  has "PROFILER vtune: expected ncu or nsys" "$work/p.out"
  if ! command -v nsys > /dev/null 2>&1 && ! command -v ncu > /dev/null 2>&1 &&
    [ ! -e /usr/local/cuda/bin/ncu ] && [ ! -e /usr/local/cuda/bin/nsys ]; then
    PATH=/usr/bin:/bin bash "$root/scripts/profile-step.sh" "$1" > "$work/p.out" 2>&1
    check test $? = 77
    has "skipped: no nsys here" "$work/p.out"
  fi
fi
[ "$failed" = 0 ] && echo "pass"
exit "$failed"
