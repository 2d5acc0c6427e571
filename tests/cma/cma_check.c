/* SPDX-License-Identifier: MIT */
/*
 * cma-check EXPECT: what process_vm_readv / process_vm_writev of a child
 * (this process's own child, which even Yama's ptrace_scope 1 allows) do
 * here; exits 0 when both end as EXPECT says (OK, EPERM or ENOSYS), 1
 * otherwise.  Run under no-cma it proves the filter really denies, so that
 * the cma suite cannot pass without exercising the owner-copy path.  With
 * OK and a kernel that refuses anyway it exits 77 (skipped).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_word[64] = "child memory";

int main(int argc, char **argv)
{
  if (argc != 2 ||
      (strcmp(argv[1], "OK") && strcmp(argv[1], "EPERM") && strcmp(argv[1], "ENOSYS"))) {
    fprintf(stderr, "usage: cma-check OK|EPERM|ENOSYS\n");
    return 2;
  }
  int want = strcmp(argv[1], "EPERM") == 0 ? EPERM : strcmp(argv[1], "ENOSYS") == 0 ? ENOSYS : 0;
  int p[2];
  if (pipe(p) != 0)
    return 1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char c;
    close(p[1]);
    ssize_t r = read(p[0], &c, 1); /* until the parent is done */
    (void)r;
    _exit(0);
  }
  close(p[0]);
  char buf[64] = "";
  struct iovec l = {buf, sizeof(buf)}, r = {g_word, sizeof(g_word)};
  errno = 0;
  ssize_t n_read = process_vm_readv(pid, &l, 1, &r, 1, 0);
  int e_read = n_read < 0 ? errno : 0;
  errno = 0;
  ssize_t n_write = process_vm_writev(pid, &l, 1, &r, 1, 0);
  int e_write = n_write < 0 ? errno : 0;
  close(p[1]);
  waitpid(pid, NULL, 0);
  printf("process_vm_readv of a child: %s; process_vm_writev: %s\n",
         e_read ? strerror(e_read) : "ok", e_write ? strerror(e_write) : "ok");
  if (want == 0 && (e_read == EPERM || e_write == EPERM || e_read == ENOSYS))
    return 77; /* the kernel refuses here anyway: nothing to compare with */
  if (e_read != want || e_write != want) {
    fprintf(stderr, "FAIL: expected %s from both\n", argv[1]);
    return 1;
  }
  if (want == 0 && strcmp(buf, "child memory") != 0) {
    fprintf(stderr, "FAIL: process_vm_readv read the wrong bytes\n");
    return 1;
  }
  return 0;
}
