/* A full disk for one directory, without root: LD_PRELOAD this library and
 * every write(), pwrite() and writev() to a file under $ENOSPC_PREFIX fails
 * with ENOSPC once $ENOSPC_BYTES bytes have been written there (by this
 * process, counted as they are asked for). Used by tests/test_survive.py
 * when it cannot mount a small tmpfs (not root).
 *
 *   cc -shared -fPIC -o enospc_shim.so enospc_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long budget = -2; /* -2: not read yet; -1: no limit */
static long long used = 0;
static const char *prefix = NULL;

static int under_prefix(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 0) return 0;
  path[n] = 0;
  return strncmp(path, prefix, strlen(prefix)) == 0;
}

/* Whether a write of n bytes to fd must fail (errno is then ENOSPC). */
static int refuse(int fd, size_t n) {
  if (budget == -2) {
    const char *b = getenv("ENOSPC_BYTES");
    prefix = getenv("ENOSPC_PREFIX");
    budget = (b && prefix) ? atoll(b) : -1;
  }
  if (budget < 0 || n == 0 || !under_prefix(fd)) return 0;
  if (__atomic_add_fetch(&used, (long long)n, __ATOMIC_SEQ_CST) > budget) {
    errno = ENOSPC;
    return 1;
  }
  return 0;
}

static size_t iov_bytes(const struct iovec *iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; i++) total += iov[i].iov_len;
  return total;
}

ssize_t write(int fd, const void *buf, size_t n) {
  static ssize_t (*real)(int, const void *, size_t);
  if (!real) real = dlsym(RTLD_NEXT, "write");
  return refuse(fd, n) ? -1 : real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void *, size_t, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "pwrite");
  return refuse(fd, n) ? -1 : real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void *, size_t, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "pwrite64");
  return refuse(fd, n) ? -1 : real(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
  static ssize_t (*real)(int, const struct iovec *, int);
  if (!real) real = dlsym(RTLD_NEXT, "writev");
  return refuse(fd, iov_bytes(iov, count)) ? -1 : real(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t off) {
  static ssize_t (*real)(int, const struct iovec *, int, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "pwritev");
  return refuse(fd, iov_bytes(iov, count)) ? -1 : real(fd, iov, count, off);
}
