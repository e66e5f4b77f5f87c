#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: capture what the agent's GPU commands read, so the console's parsers
# are checked against real output (tests/fixtures/real/). Read-only: it never resets or reconfigures a GPU.
# Usage: bash bench/gpu_probe.sh OUTDIR
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
{ uname -a; python3 --version; command -v nvidia-smi dcgmi nv-hostengine all_reduce_perf; } > "$out/env.txt" 2>&1
nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits > "$out/nvidia-smi-inventory.csv" 2>&1
nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader > "$out/nvidia-smi-list.csv" 2>&1
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader > "$out/nvidia-smi-apps.csv" 2>&1
echo "exit $?" >> "$out/nvidia-smi-apps.csv"
python3 -m agent --print-inventory --hardware linux > "$out/agent-inventory.json" 2> "$out/agent-inventory.err"
if command -v dcgmi >/dev/null; then
  (command -v nv-hostengine >/dev/null && nv-hostengine >/dev/null 2>&1) || true
  timeout 200 dcgmi diag -r 1 -j > "$out/dcgmi-diag-r1.json" 2> "$out/dcgmi-diag-r1.err"
  echo $? > "$out/dcgmi-diag-r1.exit"
fi
if command -v all_reduce_perf >/dev/null; then
  timeout 120 all_reduce_perf -b 1G -e 4G -f 2 -g 1 > "$out/all_reduce_perf.txt" 2>&1
  echo $? > "$out/all_reduce_perf.exit"
fi
ls -la "$out"
