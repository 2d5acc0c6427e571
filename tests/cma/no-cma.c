/* SPDX-License-Identifier: MIT */
/*
 * no-cma [--enosys] PROGRAM [ARGS...]: run PROGRAM where the kernel refuses
 * cross-memory attach, as Yama (ptrace_scope 1, between siblings), seccomp
 * profiles and many containers do: a seccomp filter makes
 * process_vm_readv and process_vm_writev fail with EPERM (or ENOSYS), for
 * PROGRAM and every process it starts (filters are inherited across fork
 * and exec and cannot be removed).  Plain prctl, no libseccomp.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#elif defined(__i386__)
#define NATIVE_ARCH AUDIT_ARCH_I386
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NATIVE_ARCH AUDIT_ARCH_PPC64LE
#elif defined(__s390x__)
#define NATIVE_ARCH AUDIT_ARCH_S390X
#elif defined(__riscv) && __riscv_xlen == 64
#define NATIVE_ARCH AUDIT_ARCH_RISCV64
#else
#error "no-cma: add this architecture's AUDIT_ARCH"
#endif

int main(int argc, char **argv)
{
  int err = EPERM, first = 1;
  if (argc > 1 && strcmp(argv[1], "--enosys") == 0) {
    err = ENOSYS;
    first = 2;
  }
  if (first >= argc) {
    fprintf(stderr, "usage: no-cma [--enosys] PROGRAM [ARGS...]\n");
    return 2;
  }
  const unsigned deny = SECCOMP_RET_ERRNO | (unsigned)(err & SECCOMP_RET_DATA);
  struct sock_filter filter[] = {
    /* Another architecture's system call numbers mean other calls: a
     * process of this build never makes them; refuse them outright. */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
    /* x32 numbers (bit 30 set) of the same calls. */
    BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 539, 3, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 540, 2, 0),
#else
    BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0),
    BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0),
#endif
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, deny),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof(filter) / sizeof(filter[0])), filter};
  /* Without privileges a filter needs no_new_privs (no set-uid gain later). */
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    fprintf(stderr, "no-cma: cannot install the seccomp filter: %s\n", strerror(errno));
    return 77; /* skipped: this kernel or sandbox allows no filter */
  }
  execvp(argv[first], argv + first);
  fprintf(stderr, "no-cma: cannot run %s: %s\n", argv[first], strerror(errno));
  return 127;
}
