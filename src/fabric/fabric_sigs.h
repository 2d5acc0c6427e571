/* SPDX-License-Identifier: MIT */
/*
 * A library must not take the application's signals, and some of
 * libfabric's providers do when they are loaded (infinipath's SIGINT
 * handler calls exit; fabric_int.h): every handler is saved before the
 * provider libraries load and the first fi_getinfo, and put back after.
 * Shared by the fabric transport and hixl-info's doctor, which dlopens
 * libfabric the same way.
 */
#ifndef HIXL_FABRIC_SIGS_H
#define HIXL_FABRIC_SIGS_H

#include <signal.h>
#include <stddef.h>

static const int hixl__kept_sigs[] = {SIGINT,  SIGTERM, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2,
                                      SIGSEGV, SIGBUS,  SIGILL,  SIGFPE, SIGABRT, SIGPIPE};
#define HIXL_N_KEPT_SIGS (sizeof(hixl__kept_sigs) / sizeof(hixl__kept_sigs[0]))

static inline void hixl__sigs_save(struct sigaction old[HIXL_N_KEPT_SIGS])
{
  for (size_t i = 0; i < HIXL_N_KEPT_SIGS; i++)
    sigaction(hixl__kept_sigs[i], NULL, &old[i]);
}

static inline void hixl__sigs_restore(const struct sigaction old[HIXL_N_KEPT_SIGS])
{
  for (size_t i = 0; i < HIXL_N_KEPT_SIGS; i++)
    sigaction(hixl__kept_sigs[i], &old[i], NULL);
}

#endif
