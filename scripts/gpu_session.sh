#!/usr/bin/env bash
# What trainsim measures on a lent CUDA GPU, in one command per lease (docs/gpu.md):
#   repro     a quick sweep into $RUN/repro.jsonl compared with $RUN/kernels-cuda.jsonl (run-to-run)
#   bench     the CUDA kernel suites (resumable; rows land in $RUN/kernels-cuda.jsonl)
#   captures  the shipped examples captured on the GPU at three batch sizes, for
#             `trainsim validate gpu-e2e --resume DIR`
# usage: scripts/gpu_session.sh RUN_DIR BENCH_SECONDS [repro] [bench] [captures]
# RUN_DIR travels between leases (it is resumed); results are copied to $OUT when it is set.
# Nothing here changes the GPU's settings: clocks, power and modes are read, never set.
set -u
RUN=${1:?run folder}; BENCH_S=${2:?seconds for the benchmark sweep}; shift 2
STEPS=${STEPS:-"bench captures"}; [ $# -gt 0 ] && STEPS="$*"
OUT=${OUT:-$RUN/out}
LOG=$RUN/logs; CAPS=${CAPS:-/tmp/trainsim_captures}
mkdir -p "$RUN" "$OUT" "$LOG"
if [ -d .whl ]; then  # packages the GPU image lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
ts() { python3 -m trainsim "$@"; }
t0=$(date +%s)
{ date -u; nvidia-smi; python3 -c 'import torch; p = torch.cuda.get_device_properties(0); print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), p)'; } >"$LOG/env.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv -l 5 >"$LOG/clocks.csv" 2>&1 &
smi=$!

if [[ " $STEPS " == *" repro "* ]]; then  # run-to-run: a second quick sweep against the first
  rm -f "$RUN/repro.jsonl"
  python3 -m trainsim bench --quick --device cuda --dataset "$RUN/repro.jsonl" --no-progress --format json \
    --compare-with "$RUN/kernels-cuda.jsonl" >"$LOG/repro.json" 2>>"$LOG/bench.log"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("repro", d["samples"], d["wall_s"], d["compared_with"])' "$LOG/repro.json"
  gzip -9 -n -c "$RUN/repro.jsonl" >"$OUT/repro.jsonl.gz"
fi

if [[ " $STEPS " == *" bench "* ]]; then
  ds=$RUN/kernels-cuda.jsonl
  # A quick pass over every suite first (a prefix of the full sweep: every op gets rows), then
  # roofline (the device file) and the suites in the order the LLM and DLRM models need them.
  # BENCH_GROUPS overrides the list; "SUITES@N" sweeps those suites at --density N; BENCH_OPS
  # ("op op ...") limits every group to those ops (e.g. BENCH_GROUPS=gemm BENCH_OPS=linear_tokens).
  IFS=';' read -r -a groups <<<"${BENCH_GROUPS:-QUICK;roofline;gemm attention;norm softmax elementwise optimizer;memory index;embedding;conv}"
  for group in "${groups[@]}"; do
    left=$(( t0 + BENCH_S - $(date +%s) ))
    [ "$left" -le 5 ] && { echo "bench: out of time before: $group"; break; }
    echo "== bench $group ($left s left)"
    if [ "$group" = QUICK ]; then args="--quick"
    elif [[ "$group" == *@* ]]; then args="${group%@*} --density ${group##*@}"; group=${group%@*}-x${args##* }
    else args="$group"; fi
    for op in ${BENCH_OPS:-}; do args="$args --op $op"; done
    # shellcheck disable=SC2086
    timeout "$left" python3 -m trainsim bench $args --device cuda --dtype bf16 --dtype fp32 \
      --dataset "$ds" --no-progress --format json >"$LOG/bench_${group// /_}.json" 2>>"$LOG/bench.log"
    echo "   exit $? after $(( $(date +%s) - t0 )) s; rows: $(wc -l <"$ds")"
    python3 - "$LOG/bench_${group// /_}.json" <<'PY' 2>/dev/null
import collections, json, sys
d = json.load(open(sys.argv[1]))
print("   written", d["samples"], "failed", len(d["failed"]), collections.Counter(f["error"][:70] for f in d["failed"]).most_common(3))
PY
  done
  gzip -9 -n -c "$ds" >"$OUT/kernels-cuda.jsonl.gz"
  cp "$RUN"/kernels-cuda.device.yaml "$OUT/" 2>/dev/null
fi

if [[ " $STEPS " == *" captures "* ]]; then
  caps=$CAPS/captures
  # GPU-bound batches on an H100 (the CPU defaults 64/4/8, even x16, left the step host-bound and
  # 23 % noisy); each base at half and double (cpu-e2e's factors). CAPTURE_SET overrides them;
  # WARMUP untraced steps (default 20) let the clocks leave idle first.
  for rep in 0 1; do
    for mb in ${CAPTURE_SET:-llama:2 llama:1 llama:4 resnet:1024 resnet:512 resnet:2048 dlrm:16384 dlrm:8192 dlrm:32768 gpt2:1024 gpt2:512 gpt2:2048}; do
      m=${mb%%:*}; b=${mb##*:}; dir=$caps/${m}_b${b}_t1_s5_r${rep}
      [ -f "$dir/capture.json" ] && continue
      [ $(( $(date +%s) - t0 )) -ge "${END_S:-540}" ] && { echo "captures: out of time at $m b$b r$rep"; break 2; }
      ts capture --model "$m" --device cuda --batch-size "$b" --threads 1 --steps 5 --warmup "${WARMUP:-20}" --out "$dir" \
        --overwrite --format json >"$LOG/capture_${m}_b${b}_r${rep}.json" 2>>"$LOG/capture.log" \
        || echo "capture $m b$b r$rep failed (see capture.log)"
    done
  done
  ( set -o pipefail; tar -C "$CAPS" -cf - captures | xz -T0 -6 >"$OUT/captures.tar.xz" ) || echo "captures: archiving failed"
fi
kill "$smi" 2>/dev/null
tar -C "$RUN" -czf "$OUT/logs.tgz" logs
echo "done in $(( $(date +%s) - t0 )) s"
ls -la "$OUT"
