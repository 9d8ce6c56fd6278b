/* The Open MPI baseline of compare_openmpi.sh: float32 MPI_Allreduce (in place, SUM) per size,
 * timed as c10d-bench times all_reduce: warm-up, barrier, N iterations, mean per iteration,
 * maximum over the ranks. Prints "<bytes> <microseconds>" per size on rank 0.
 * Usage: openmpi_allreduce ITERS WARMUP BYTES... */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iters = atoi(argv[1]), warmup = atoi(argv[2]);
    for (int a = 3; a < argc; a++) {
        long bytes = atol(argv[a]);
        int count = (int)(bytes / 4);
        float *buf = malloc((size_t)count * sizeof(float));
        for (int i = 0; i < count; i++) buf[i] = (float)(rank + i % 7);
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / iters, worst;
        MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.3f\n", bytes, worst * 1e6);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
