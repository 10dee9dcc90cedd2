#!/usr/bin/env bash
# The reference workloads of shared/BENCHMARKS.md (per-GPU batch) and how long each
# benchmark runs them. Sourced by bench-vs-torch.sh and bench-ddp.sh.
# Every workload in both precisions, the benchmarks' default.
ddp_default_runs=(tiny:tf32 tiny:bf16 medium:tf32 medium:bf16 large:tf32 large:bf16)

# Usage: ddp_workload NAME  -> sets layers, batch, steps (ddptrain), tsteps (PyTorch), samples
# (synthetic set), compiles (1 where bench-vs-torch.sh compiles PyTorch's step too: not large,
# whose step is its cuBLAS products in every mode, the graph-captured one its best, and whose
# compiling took 80 s a precision, more than one device call can spare beside the others)
ddp_workload() {
  compiles=1
  case "$1" in
    tiny) layers=784,512,512,10; batch=128; steps=6000; tsteps=2000; samples=60000 ;;
    medium) layers=1024,4096,4096,4096,4096,1000; batch=1024; steps=600; tsteps=300; samples=8192 ;;
    large) layers=8192,8192,8192,8192,8192,8192,8192,8192,8192; batch=4096; steps=60; tsteps=30; samples=8192
      compiles=0 ;;
    *) echo "unknown workload $1 (expected tiny, medium or large)" >&2; return 2 ;;
  esac
}

# The value of KEY in the last JSON line of FILE that has it.
ddp_json() {
  "${PYTHON:-python3}" -c "import json,sys; d=[json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith('{')]; print([x for x in d if sys.argv[2] in x][-1][sys.argv[2]])" "$@"
}
