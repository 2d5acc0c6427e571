/* SPDX-License-Identifier: MIT */
/* Leveled logging to stderr, chosen with HIXL_LOG=error|warn|info|debug
 * (default warn).  Off the fast path only. */
#ifndef HIXL_LOG_H
#define HIXL_LOG_H

enum { HIXL_LOG_ERROR = 0, HIXL_LOG_WARN, HIXL_LOG_INFO, HIXL_LOG_DEBUG };
extern int hixl__log_level;
void hixl__log_init(void);
void hixl__log_emit(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), cold));
#define hixl__log(level, ...)                                                                      \
  do {                                                                                             \
    if (__builtin_expect((level) <= hixl__log_level, 0))                                           \
      hixl__log_emit(level, __FILE__, __LINE__, __VA_ARGS__);                                      \
  } while (0)
#define hixl_debug(...) hixl__log(HIXL_LOG_DEBUG, __VA_ARGS__)
#define hixl_info(...) hixl__log(HIXL_LOG_INFO, __VA_ARGS__)
#define hixl_warn(...) hixl__log(HIXL_LOG_WARN, __VA_ARGS__)

#endif
