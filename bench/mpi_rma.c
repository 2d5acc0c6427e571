/* SPDX-License-Identifier: MIT */
/*
 * The MPI side of bench/compare.py: Open MPI one-sided (MPI_Put / MPI_Get +
 * MPI_Win_flush, MPI_Fetch_and_op, MPI_Compare_and_swap) and two-sided
 * (MPI_Send / MPI_Recv) on the sizes given, measured the way hixl-perf
 * measures (so the figures sit side by side):
 *
 *   latency   one operation and its completion (flush), p50 over the
 *             iterations, in us; send/recv: half a ping-pong round trip;
 *   bandwidth a window of 64 operations, then a flush (send/recv: 64
 *             MPI_Isend against 64 pre-posted MPI_Irecv, then a 1-byte ack).
 *
 * Two ranks: rank 0 initiates, rank 1 owns the window (passive target, a
 * lock_all epoch).  One line per measurement:
 *   mpi <op> <size> <p50_us> <gbps> <mops>
 * Build: mpicc -O2 -o mpi_rma bench/mpi_rma.c
 * Run:   mpirun -np 2 --mca osc sm ./mpi_rma 8,4096,65536 ITERS
 * (Debian's default osc/rdma component segfaults in MPI_Compare_and_swap
 * here; see shared/BASELINES.md.)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double p50(double *v, int n)
{
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[n / 2];
}

static int iters_for(size_t size, int max)
{
  long n = (long)((256l << 20) / (long)size);
  return n < 20 ? 20 : n > max ? max : (int)n;
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2 || argc < 2) {
    if (rank == 0)
      fprintf(stderr, "usage: mpirun -np 2 mpi_rma SIZE[,SIZE...] [MAXITERS]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int max_iters = argc > 2 ? atoi(argv[2]) : 100000;
  size_t sizes[64];
  int nsizes = 0;
  for (char *tok = strtok(argv[1], ","); tok && nsizes < 64; tok = strtok(NULL, ","))
    sizes[nsizes++] = strtoull(tok, NULL, 0);
  size_t maxs = 8;
  for (int i = 0; i < nsizes; i++)
    maxs = sizes[i] > maxs ? sizes[i] : maxs;

  char *base, *local = malloc(maxs);
  MPI_Win win;
  MPI_Win_allocate((MPI_Aint)maxs, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  memset(base, 0, maxs);
  memset(local, 1, maxs);
  double *lat = malloc(sizeof(double) * (size_t)max_iters);
  MPI_Win_lock_all(0, win);
  MPI_Barrier(MPI_COMM_WORLD);

  /* One-sided: rank 0 only; rank 1 waits in the barrier below. */
  if (rank == 0) {
    static const char *ops[] = {"put", "get"};
    for (int o = 0; o < 2; o++)
      for (int i = 0; i < nsizes; i++) {
        size_t s = sizes[i];
        int n = iters_for(s, max_iters), ln = n < 20000 ? n : 20000;
        for (int k = 0; k < 16; k++) { /* warm-up */
          if (o == 0)
            MPI_Put(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          else
            MPI_Get(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          MPI_Win_flush(1, win);
        }
        for (int k = 0; k < ln; k++) {
          double t0 = MPI_Wtime();
          if (o == 0)
            MPI_Put(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          else
            MPI_Get(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          MPI_Win_flush(1, win);
          lat[k] = (MPI_Wtime() - t0) * 1e6;
        }
        double t0 = MPI_Wtime();
        for (int k = 0; k < n; k++) {
          if (o == 0)
            MPI_Put(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          else
            MPI_Get(local, (int)s, MPI_BYTE, 1, 0, (int)s, MPI_BYTE, win);
          if ((k + 1) % WINDOW == 0)
            MPI_Win_flush(1, win);
        }
        MPI_Win_flush(1, win);
        double dt = MPI_Wtime() - t0;
        printf("mpi %s %zu %.4f %.4f %.4f\n", ops[o], s, p50(lat, ln), (double)s * n / dt / 1e9,
               n / dt / 1e6);
        fflush(stdout);
      }
    /* Atomics on 8 bytes. */
    int64_t one = 1, old = 0, cmp = 0;
    for (int o = 0; o < 2; o++) {
      int n = max_iters < 20000 ? max_iters : 20000;
      for (int k = 0; k < n; k++) {
        double t0 = MPI_Wtime();
        if (o == 0)
          MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 1, 0, MPI_SUM, win);
        else
          MPI_Compare_and_swap(&one, &cmp, &old, MPI_INT64_T, 1, 0, win);
        MPI_Win_flush(1, win);
        lat[k] = (MPI_Wtime() - t0) * 1e6;
      }
      double t0 = MPI_Wtime();
      for (int k = 0; k < n; k++) {
        if (o == 0)
          MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 1, 0, MPI_SUM, win);
        else
          MPI_Compare_and_swap(&one, &cmp, &old, MPI_INT64_T, 1, 0, win);
        if ((k + 1) % WINDOW == 0)
          MPI_Win_flush(1, win);
      }
      MPI_Win_flush(1, win);
      double dt = MPI_Wtime() - t0;
      printf("mpi %s 8 %.4f %.4f %.4f\n", o == 0 ? "faa" : "cas", p50(lat, n), 8.0 * n / dt / 1e9,
             n / dt / 1e6);
      fflush(stdout);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_unlock_all(win);

  /* Two-sided: ping-pong latency, then windowed bandwidth. */
  char *rbuf = malloc(maxs * WINDOW), ack = 0;
  MPI_Request reqs[WINDOW];
  for (int i = 0; i < nsizes; i++) {
    size_t s = sizes[i];
    int n = iters_for(s, max_iters), ln = n < 20000 ? n : 20000;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int k = -16; k < ln; k++) {
      double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(local, (int)s, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(rbuf, (int)s, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(rbuf, (int)s, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(local, (int)s, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
      }
      if (k >= 0)
        lat[k] = (MPI_Wtime() - t0) * 1e6 / 2;
    }
    int rounds = (n + WINDOW - 1) / WINDOW;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int r = 0; r < rounds; r++) {
      for (int w = 0; w < WINDOW; w++) {
        if (rank == 0)
          MPI_Isend(local, (int)s, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &reqs[w]);
        else
          MPI_Irecv(rbuf + (size_t)w * s, (int)s, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &reqs[w]);
      }
      MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
      if (rank == 0)
        MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      else
        MPI_Send(&ack, 1, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
    }
    double dt = MPI_Wtime() - t0;
    if (rank == 0) {
      double total = (double)rounds * WINDOW;
      printf("mpi sendrecv %zu %.4f %.4f %.4f\n", s, p50(lat, ln), (double)s * total / dt / 1e9,
             total / dt / 1e6);
      fflush(stdout);
    }
  }
  free(rbuf);
  free(lat);
  free(local);
  MPI_Win_free(&win);
  MPI_Finalize();
  return 0;
}
