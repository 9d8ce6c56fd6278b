#!/usr/bin/env bash
# c10d-gloo vs PyTorch's Gloo, same sizes, iteration counts and timing method, measured in one
# run. The two are run alternately RUNS times (default 3) and the best time per size of each is
# kept, so that load from other processes on the machine hurts both alike.
# usage: crates/c10d-gloo/benches/compare.sh [NPROC] [OP] [MAX_BYTES] [RUNS]
set -euo pipefail
N=${1:-2}; OP=${2:-all_reduce}; MAX=${3:-67108864}; RUNS=${4:-3}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${C10D_TORCH_PYTHON:-$HOME/.cache/c10d-rs/torch-venv/bin/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build -q --release -p c10d-gloo --bin c10d-gloo-worker --manifest-path "$ROOT/Cargo.toml"
OURS=$(mktemp); THEIRS=$(mktemp)
for i in $(seq "$RUNS"); do
  "$CARGO_TARGET_DIR/release/c10d-gloo-worker" launch --nproc "$N" --op "$OP" --max-bytes "$MAX" | grep " float " >> "$OURS"
  "$PY" "$ROOT/crates/c10d-gloo/benches/torch_gloo_bench.py" --nproc "$N" --op "$OP" --max-bytes "$MAX" | grep " float " >> "$THEIRS"
done
best() { awk '{ if (!($1 in t) || $4 < t[$1]) { t[$1]=$4; b[$1]=$6; w[$1]+=$7 } else { w[$1]+=$7 } } END { for (k in t) print k, t[k], b[k], w[k] }' "$1" | sort -n; }
echo "# $OP, $N ranks, float32, best of $RUNS alternating runs ($(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg))"
printf "%12s %14s %14s %12s %12s %9s %7s\n" "size(B)" "c10d-gloo(us)" "torch(us)" "busbw ours" "busbw torch" "speed-up" "#wrong"
join <(best "$OURS") <(best "$THEIRS") | awk '{ printf "%12s %14.1f %14.1f %12.3f %12.3f %8.2fx %7d\n", $1, $2, $5, $3, $6, $5/$2, $4+$7 }'
rm -f "$OURS" "$THEIRS"
