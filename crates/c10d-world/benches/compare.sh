#!/usr/bin/env bash
# c10d-bench (c10d-rs Gloo) beside PyTorch's Gloo (torch_gloo_bench.py), measured in one run with
# the same sizes, iteration counts, timing method and element checks.
#
# usage: crates/c10d-world/benches/compare.sh [RUNS]
#   RUNS (default 2): ours and PyTorch run alternately RUNS times per rank count; the best time per
#   size of each is kept, so load from other processes on the machine hurts both alike.
# env:   NPROCS (default "2 4"), OP (all_reduce), DTYPE (float), MIN (1K), MAX (64M),
#        C10D_TORCH_PYTHON (default ~/.cache/c10d-rs/torch-venv/bin/python), CARGO_TARGET_DIR.
# Prints one table per rank count with both busbw figures and the speed-up (torch time / our time)
# (equal to the busbw ratio), then the issue-3 targets: 2 ranks 1 KiB <= 20 us; 4 ranks 1 KiB <= 200 us; busbw at 16 MiB
# >= 1.5x PyTorch's. Exit status 1 if any element was wrong or a run failed (targets only report).
set -euo pipefail
RUNS=${1:-2}
NPROCS=${NPROCS:-"2 4"}
OP=${OP:-all_reduce}
DTYPE=${DTYPE:-float}
MIN=${MIN:-1K}
MAX=${MAX:-64M}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${C10D_TORCH_PYTHON:-$HOME/.cache/c10d-rs/torch-venv/bin/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q --release -p c10d-tools --bin c10d-bench --manifest-path "$ROOT/Cargo.toml"
BENCH="$CARGO_TARGET_DIR/release/c10d-bench"
TORCH_BENCH="$ROOT/crates/c10d-world/benches/torch_gloo_bench.py"
HAVE_TORCH=1
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "# PyTorch not found at $PY (set C10D_TORCH_PYTHON): showing c10d-rs figures only"
  HAVE_TORCH=0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STATUS=0
TARGETS=()

# best FILE: per size, the row with the smallest time -> "size time busbw wrong_total"
best() {
  awk '!/^#/ && NF == 8 { s = $1; if (!(s in t) || $5 < t[s]) { t[s] = $5; b[s] = $7 } w[s] += $8 }
       END { for (s in t) print s, t[s], b[s], w[s] }' "$1" | sort -n
}

echo "# $OP, $DTYPE, 127.0.0.1, best of $RUNS alternating runs; $(date -u +%FT%TZ); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for N in $NPROCS; do
  : >"$TMP/ours" ; : >"$TMP/torch"
  for _ in $(seq "$RUNS"); do
    "$BENCH" "$OP" --nproc "$N" -b "$MIN" -e "$MAX" -d "$DTYPE" >>"$TMP/ours" || STATUS=1
    if [ "$HAVE_TORCH" = 1 ]; then
      "$PY" "$TORCH_BENCH" "$OP" --nproc "$N" -b "$MIN" -e "$MAX" -d "$DTYPE" >>"$TMP/torch" 2>"$TMP/torch.err" || { STATUS=1; cat "$TMP/torch.err" >&2; }
    fi
  done
  best "$TMP/ours" >"$TMP/ours.best"
  echo
  echo "# $N ranks"
  if [ "$HAVE_TORCH" = 1 ]; then
    best "$TMP/torch" >"$TMP/torch.best"
    # Same size and rank count: the busbw ratio equals the speed-up (torch time / our time).
    printf "# %10s %13s %13s %9s %12s %12s %7s\n" "size(B)" "c10d-rs(us)" "torch(us)" "speed-up" "busbw ours" "busbw torch" "#wrong"
    join "$TMP/ours.best" "$TMP/torch.best" | awk '{ printf "  %10d %13.2f %13.2f %8.2fx %12.3f %12.3f %7d\n", $1, $2, $5, $5 / $2, $3, $6, $4 + $7 }'
    join "$TMP/ours.best" "$TMP/torch.best" | awk '$4 + $7 > 0 { bad = 1 } END { exit bad }' || STATUS=1
  else
    printf "# %10s %13s %12s %7s\n" "size(B)" "c10d-rs(us)" "busbw ours" "#wrong"
    awk '{ printf "  %10d %13.2f %12.3f %7d\n", $1, $2, $3, $4 }' "$TMP/ours.best"
    awk '$4 > 0 { bad = 1 } END { exit bad }' "$TMP/ours.best" || STATUS=1
  fi
  # Targets of issue 3 (all_reduce).
  if [ "$OP" = all_reduce ]; then
    T1K=$(awk '$1 == 1024 { print $2 }' "$TMP/ours.best")
    LIMIT=""
    [ "$N" = 2 ] && LIMIT=20
    [ "$N" = 4 ] && LIMIT=200
    if [ -n "$T1K" ] && [ -n "$LIMIT" ]; then
      V=$(awk -v t="$T1K" -v l="$LIMIT" 'BEGIN { print (t <= l) ? "met" : "NOT met" }')
      TARGETS+=("$N ranks, 1 KiB: ${T1K} us (target <= ${LIMIT} us): $V")
    fi
    if [ "$HAVE_TORCH" = 1 ]; then
      R16=$(join "$TMP/ours.best" "$TMP/torch.best" | awk '$1 == 16777216 && $2 > 0 { printf "%.2f %.3f %.3f", $5 / $2, $3, $6 }')
      if [ -n "$R16" ]; then
        set -- $R16
        V=$(awk -v r="$1" 'BEGIN { print (r >= 1.5) ? "met" : "NOT met" }')
        TARGETS+=("$N ranks, 16 MiB busbw: ${2} vs torch ${3} GB/s = ${1}x (target >= 1.5x): $V")
      fi
    fi
  fi
done
if [ ${#TARGETS[@]} -gt 0 ]; then
  echo
  echo "# targets (issue 3)"
  for t in "${TARGETS[@]}"; do echo "#   $t"; done
fi
exit $STATUS
