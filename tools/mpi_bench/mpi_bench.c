/* The Open MPI peer column of tools/dev bench (scripts/bench_sweep.sh): times
 * MPI's own collectives with comms-bench's rules, so the two columns compare
 * like for like:
 *   - float32, sum, out of place; root 0 for broadcast, reduce, gather and
 *     scatter; send_recv exchanges with rank ^ 1;
 *   - sizes from --minbytes to --maxbytes, each the next multiplied by
 *     --stepfactor and rounded down to whole units (an element, times the
 *     ranks where the size is the whole buffer: all_gather, reduce_scatter,
 *     all_to_all, gather, scatter, as nccl-tests and comms-bench count);
 *   - --warmup untimed, then --iters timed iterations; each iteration takes
 *     as long as its slowest rank (max over ranks), p50 and p99 of those;
 *     algbw = bytes / mean, busbw = algbw * nccl-tests' factor.
 * Run under mpirun; rank 0 prints a table and writes --json.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* name;
  int size_is_total;
  double (*bus_factor)(int n);
  const char* mpi_name;
} OpInfo;

static double one(int n) { (void)n; return 1; }
static double all_reduce_factor(int n) { return 2.0 * (n - 1) / n; }
static double gather_factor(int n) { return (double)(n - 1) / n; }

static const OpInfo kOps[] = {
    {"all_reduce", 0, all_reduce_factor, "MPI_Allreduce"},
    {"all_gather", 1, gather_factor, "MPI_Allgather"},
    {"reduce_scatter", 1, gather_factor, "MPI_Reduce_scatter_block"},
    {"broadcast", 0, one, "MPI_Bcast"},
    {"reduce", 0, one, "MPI_Reduce"},
    {"all_to_all", 1, gather_factor, "MPI_Alltoall"},
    {"gather", 1, gather_factor, "MPI_Gather"},
    {"scatter", 1, gather_factor, "MPI_Scatter"},
    {"barrier", 0, one, "MPI_Barrier"},
    {"send_recv", 0, one, "MPI_Sendrecv"},
};

static size_t parse_size(const char* text) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (end && (*end == 'K' || *end == 'k')) v *= 1024;
  else if (end && (*end == 'M' || *end == 'm')) v *= 1024.0 * 1024;
  else if (end && (*end == 'G' || *end == 'g')) v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* One op of `count` elements per rank (the OpDesc convention). */
static void issue(const OpInfo* op, float* in, float* out, size_t count, int n, int rank) {
  const int c = (int)count;
  if (!strcmp(op->name, "all_reduce")) MPI_Allreduce(in, out, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "all_gather")) MPI_Allgather(in, c, MPI_FLOAT, out, c, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "reduce_scatter")) MPI_Reduce_scatter_block(in, out, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "broadcast")) MPI_Bcast(rank == 0 ? in : out, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "reduce")) MPI_Reduce(in, out, c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "all_to_all")) MPI_Alltoall(in, c, MPI_FLOAT, out, c, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "gather")) MPI_Gather(in, c, MPI_FLOAT, out, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "scatter")) MPI_Scatter(in, c, MPI_FLOAT, out, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(op->name, "barrier")) MPI_Barrier(MPI_COMM_WORLD);
  else if (!strcmp(op->name, "send_recv")) {
    const int peer = rank ^ 1;
    MPI_Sendrecv(in, c, MPI_FLOAT, peer, 0, out, c, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  (void)n;
}

static void usage(void) {
  fprintf(stderr, "usage: mpi-bench --op NAME [--minbytes 4K] [--maxbytes 16M] [--stepfactor 4] [--iters 50] "
                  "[--warmup 5] [--json PATH]\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char* op_name = "all_reduce";
  const char* json_path = NULL;
  size_t lo = 4096, hi = 16u << 20;
  double factor = 4;
  int iters = 50, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--op")) op_name = argv[i + 1];
    else if (!strcmp(argv[i], "--minbytes")) lo = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--maxbytes")) hi = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--stepfactor")) factor = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--json")) json_path = argv[i + 1];
    else {
      if (rank == 0) usage();
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  const OpInfo* op = NULL;
  for (size_t i = 0; i < sizeof kOps / sizeof kOps[0]; ++i) {
    if (!strcmp(kOps[i].name, op_name)) op = &kOps[i];
  }
  if (!op || iters <= 0 || factor <= 1.0 || (!strcmp(op_name, "send_recv") && n % 2)) {
    if (rank == 0) usage();
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const size_t es = sizeof(float);
  const size_t unit = op->size_is_total ? es * (size_t)n : es;
  FILE* json = rank == 0 && json_path ? fopen(json_path, "w") : NULL;
  if (json) fprintf(json, "[");
  if (rank == 0) printf("# mpi-bench %s, %d ranks, float32 sum, out-of-place\n%12s %10s %10s %10s %10s  %s\n",
                        op->name, n, "bytes", "p50(us)", "p99(us)", "algbw", "busbw", "algorithm");
  double* times = malloc(sizeof(double) * (size_t)iters);
  double* sorted = malloc(sizeof(double) * (size_t)iters);
  int first = 1;
  for (size_t bytes = lo; bytes <= hi;) {
    size_t count = bytes / es;
    if (op->size_is_total) count /= (size_t)n;
    const size_t big = op->size_is_total ? count * (size_t)n : count;
    float* in = malloc(big * es + 64);
    float* out = malloc(big * es + 64);
    for (size_t i = 0; i < big; ++i) in[i] = (float)((rank + 1) + i % 3);
    memset(out, 0, big * es);
    for (int i = 0; i < warmup; ++i) issue(op, in, out, count, n, rank);
    for (int i = 0; i < iters; ++i) {
      const double t0 = MPI_Wtime();
      issue(op, in, out, count, n, rank);
      times[i] = (MPI_Wtime() - t0) * 1e6;
    }
    MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    memcpy(sorted, times, sizeof(double) * (size_t)iters);
    qsort(sorted, (size_t)iters, sizeof(double), cmp_double);
    double mean = 0;
    for (int i = 0; i < iters; ++i) mean += times[i] / iters;
    const size_t row_bytes = !strcmp(op->name, "barrier") ? 0 : (op->size_is_total ? count * (size_t)n * es : count * es);
    const double p50 = sorted[iters / 2];
    int p99i = iters * 99 / 100;
    if (p99i > iters - 1) p99i = iters - 1;
    const double p99 = sorted[p99i];
    const double algbw = mean > 0 ? (double)row_bytes / (mean * 1e3) : 0;
    const double busbw = algbw * op->bus_factor(n);
    if (rank == 0) {
      printf("%12zu %10.1f %10.1f %10.3f %10.3f  %s\n", row_bytes, p50, p99, algbw, busbw, op->mpi_name);
      if (json) {
        fprintf(json, "%s\n {\"op\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"count\": %zu, \"mean_us\": %.3f, "
                      "\"p50_us\": %.3f, \"p99_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
                      "\"algorithm\": \"%s\"}",
                first ? "" : ",", op->name, n, row_bytes, count, mean, p50, p99, algbw, busbw, op->mpi_name);
        first = 0;
      }
    }
    free(in);
    free(out);
    if (!strcmp(op->name, "barrier")) break;
    const double grown = ceil((double)bytes * factor);
    if (grown > (double)hi) break;
    const size_t next = (size_t)grown;
    const size_t stepped = next - next % unit;
    bytes = stepped > bytes + unit ? stepped : bytes + unit;
  }
  if (json) {
    fprintf(json, "\n]\n");
    fclose(json);
  }
  free(times);
  free(sorted);
  MPI_Finalize();
  return 0;
}
