/* LD_PRELOAD spy on MKL's VML entry points inside libtorch_cpu.so (issue 21, pytorch#188792).
 *
 * oneMKL picks a VML function's kernel on its first call; two threads in that first call at once
 * can leave one of them on a low-accuracy kernel. The spy holds each function's first call for
 * VML_SPY_HOLD_US microseconds (so a second thread's call, if the program makes one, lands inside
 * it), then calls the real function. Each line it writes to VML_SPY_OUT (O_APPEND):
 *   first <name> <n> <pid>        the first call of <name> in process <pid>, on n elements
 *   concurrent <name> <n> <pid>   a call of <name> that began while its first call was still running
 * scripts/vml_spy.py builds it, runs commands under it and reads what it wrote.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*vml_fn)(int, const void *, void *, unsigned long long);

#define VML_FUNCTIONS(X) \
  X(Acos) X(Asin) X(Atan) X(Cos) X(Erf) X(Erfc) X(ErfInv) X(Exp) X(Ln) X(Log10) X(Log2) X(Sin) \
  X(Sqrt) X(Tan) X(Tanh) X(Trunc)

enum {
#define ENUM(f) S_##f, D_##f,
  VML_FUNCTIONS(ENUM)
#undef ENUM
  N_FUNCTIONS
};

static vml_fn real_fn[N_FUNCTIONS];
static atomic_int calls[N_FUNCTIONS];
static atomic_int first_running[N_FUNCTIONS];

static void report(const char *what, const char *name, int n) {
  const char *path = getenv("VML_SPY_OUT");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  char line[128];
  int len = snprintf(line, sizeof line, "%s %s %d %d\n", what, name, n, (int)getpid());
  (void)!write(fd, line, len);
  close(fd);
}

static vml_fn resolve(const char *name) {
  const char *lib = getenv("VML_SPY_LIB");  /* libtorch_cpu.so, where torch's MKL lives */
  void *handle = lib ? dlopen(lib, RTLD_LAZY | RTLD_NOLOAD) : NULL;
  void *fn = handle ? dlsym(handle, name) : dlsym(RTLD_NEXT, name);
  if (!fn) {
    fprintf(stderr, "vml_spy: %s not found\n", name);
    abort();
  }
  return (vml_fn)fn;
}

static void spy(int i, const char *name, int n, const void *a, void *r, unsigned long long mode) {
  if (!real_fn[i]) real_fn[i] = resolve(name);
  int order = atomic_fetch_add(&calls[i], 1);
  if (order == 0) {
    atomic_store(&first_running[i], 1);
    report("first", name, n);
    const char *hold = getenv("VML_SPY_HOLD_US");
    usleep(hold ? atoi(hold) : 200000);
  } else if (atomic_load(&first_running[i])) {
    report("concurrent", name, n);
  }
  real_fn[i](n, a, r, mode);
  if (order == 0) atomic_store(&first_running[i], 0);
}

#define DEFINE(f)                                                                   \
  void vms##f(int n, const float *a, float *r, unsigned long long mode) {         \
    spy(S_##f, "vms" #f, n, a, r, mode);                                            \
  }                                                                                 \
  void vmd##f(int n, const double *a, double *r, unsigned long long mode) {       \
    spy(D_##f, "vmd" #f, n, a, r, mode);                                            \
  }
VML_FUNCTIONS(DEFINE)
