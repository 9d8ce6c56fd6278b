#!/usr/bin/env bash
# Small-message all_reduce on one host: c10d-bench (shared memory by default, and with
# C10D_GLOO_SHM=0) against Open MPI's shared-memory transport (btl self,vader) and its TCP
# transport (btl self,tcp), in the same run, alternating, best of ROUNDS per size.
# Open MPI is installed with apt when missing. Sizes in bytes; float32 SUM, in place.
#   bash crates/c10d-world/benches/compare_openmpi.sh [ROUNDS]      (NPROCS="2 4" SIZES="1024 65536")
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${1:-5}
NPROCS=${NPROCS:-"2 4"}
SIZES=${SIZES:-"1024 4096 65536 262144 1048576 16777216"}
ITERS=${ITERS:-500}
if ! command -v mpicc >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null
fi
mkdir -p target/openmpi
mpicc -O2 -o target/openmpi/allreduce crates/c10d-world/benches/openmpi_allreduce.c
cargo build --release -q -p c10d-tools --bin c10d-bench
BENCH=target/release/c10d-bench
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

ours() { # nprocs bytes shm → µs
  C10D_GLOO_SHM=$3 "$BENCH" all_reduce --nproc "$1" -b "$2" -e "$2" -n "$ITERS" -w 50 -c 0 \
    | awk '!/^#/ {print $5}'
}
openmpi() { # nprocs bytes btl → µs
  "${MPI[@]}" -np "$1" --mca btl "$3" target/openmpi/allreduce "$ITERS" 50 "$2" | awk '{print $2}'
}
best() { sort -g | head -1; }

echo "# float32 all_reduce, µs per op (best of $ROUNDS alternating rounds; max over ranks)"
echo "| ranks | bytes | c10d-rs (shm) | c10d-rs (sockets) | Open MPI vader | Open MPI tcp | c10d-rs / vader |"
echo "|---|---|---|---|---|---|---|"
for n in $NPROCS; do
  for b in $SIZES; do
    a=(); s=(); v=(); t=()
    for _ in $(seq "$ROUNDS"); do
      a+=("$(ours "$n" "$b" 1)"); v+=("$(openmpi "$n" "$b" self,vader)")
      s+=("$(ours "$n" "$b" 0)"); t+=("$(openmpi "$n" "$b" self,tcp)")
    done
    A=$(printf '%s\n' "${a[@]}" | best); S=$(printf '%s\n' "${s[@]}" | best)
    V=$(printf '%s\n' "${v[@]}" | best); T=$(printf '%s\n' "${t[@]}" | best)
    R=$(awk -v a="$A" -v v="$V" 'BEGIN {printf "%.2f", a / v}')
    echo "| $n | $b | $A | $S | $V | $T | $R |"
  done
done
