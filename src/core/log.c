/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int hixl__log_level = HIXL_LOG_WARN;

void hixl__log_init(void)
{
  static const char *const names[] = {"error", "warn", "info", "debug"};
  const char *v = getenv("HIXL_LOG");
  if (v == NULL)
    return;
  for (int i = 0; i < 4; i++)
    if (strcmp(v, names[i]) == 0)
      hixl__log_level = i;
}

void hixl__log_emit(int level, const char *file, int line, const char *fmt, ...)
{
  static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char buf[1280]; /* a whole error message (HIXL_ERR_MAX, 1024) and the line's prefix */
  const char *base = strrchr(file, '/');
  int n = snprintf(buf, sizeof(buf), "[hixl %d %s %s:%d] ", (int)getpid(), tags[level],
                   base ? base + 1 : file, line);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof(buf))
    vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", buf);
}
