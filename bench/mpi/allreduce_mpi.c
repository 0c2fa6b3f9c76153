/*
 * bench/mpi/allreduce_mpi.c — OpenMPI's MPI_Allreduce timings, nccl-tests
 * style, for bench/allreduce_vs.sh (built there with mpicc; not part of the
 * CMake build). Prints one JSON object per size from rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int iters_for(long nbytes) { return nbytes <= 65536 ? 200 : nbytes <= (4L << 20) ? 50 : 10; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long max_bytes = argc > 1 ? atol(argv[1]) : 256L << 20;
    float *buf = malloc((size_t)max_bytes);
    for (long i = 0; i < max_bytes / 4; i++) buf[i] = 1.0f;
    for (long nbytes = 8; nbytes <= max_bytes; nbytes *= 2) {
        int n = iters_for(nbytes), count = (int)(nbytes / 4);
        for (int i = 0; i < n / 10 + 2; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = (MPI_Wtime() - t0) / n;
        if (rank == 0) {
            double algbw = (double)nbytes / dt / 1e9;
            printf("{\"impl\": \"mpi\", \"bytes\": %ld, \"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f}\n", nbytes,
                   dt * 1e6, algbw, algbw * 2.0 * (size - 1) / size);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
