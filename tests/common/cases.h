/* SPDX-License-Identifier: MIT */
/*
 * One table of cases per test program, the name and the function, used both
 * to run a case and to check the names given on the command line: a name
 * that is no case fails (exit 2, "unknown case 'x'; cases: a, b, c" on
 * stderr) instead of running nothing and passing.  Every program with a
 * table also takes, as its first argument,
 *
 *   --list           its case names, one a line (exit 0);
 *   --check NAME...  exit 0 if every NAME is a case, else 2 as above.
 *
 * tests/meson.build runs --check with every name it hands a program (suite
 * 'unit'), so a case renamed in C and not there fails even where the test
 * itself is not built or run (fabric without libfabric).
 *
 * Plain programs list struct test_case; cmocka ones their CMUnitTest array,
 * whose names lose a "test_" prefix (test_put_get is the case put_get).
 * Header only: the hostile programs link no harness.
 */
#ifndef HIXL_TEST_CASES_H
#define HIXL_TEST_CASES_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct test_case {
  const char *name;
  int (*run)(void); /* returns the exit status (or exits) */
};

/* A table of any element type whose first member is its name. */
struct cases {
  const void *table;
  size_t n, stride;
};
#define CASES(arr) ((struct cases){(arr), sizeof(arr) / sizeof((arr)[0]), sizeof((arr)[0])})

static inline const char *cases_name(struct cases c, size_t i)
{
  const char *name = *(const char *const *)(const void *)((const char *)c.table + i * c.stride);
  return strncmp(name, "test_", 5) == 0 ? name + 5 : name;
}

/* "a, b, c" */
static inline void cases_print(FILE *f, struct cases c)
{
  for (size_t i = 0; i < c.n; i++)
    fprintf(f, "%s%s", i ? ", " : "", cases_name(c, i));
}

/* The index of the case called name; -1 after saying so on stderr. */
static inline long cases_find(struct cases c, const char *name)
{
  for (size_t i = 0; i < c.n; i++)
    if (strcmp(cases_name(c, i), name) == 0)
      return (long)i;
  fprintf(stderr, "unknown case '%s'; cases: ", name);
  cases_print(stderr, c);
  fprintf(stderr, "\n");
  return -1;
}

/* Call first in main() (after harness_init): serves --list and --check and
 * exits; returns otherwise. */
static inline void cases_options(struct cases c, int argc, char **argv)
{
  if (argc < 2)
    return;
  if (strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < c.n; i++)
      printf("%s\n", cases_name(c, i));
    exit(0);
  }
  if (strcmp(argv[1], "--check") == 0) {
    if (argc < 3) {
      fprintf(stderr, "usage: %s --check CASE...\n", argv[0]);
      exit(2);
    }
    for (int i = 2; i < argc; i++)
      if (cases_find(c, argv[i]) < 0)
        exit(2);
    exit(0);
  }
}

/* Run the case called name (every case in order when name is NULL: the
 * first failing status is returned); 2 if there is no such case. */
static inline int cases_run(const struct test_case *t, size_t n, const char *name)
{
  struct cases c = {t, n, sizeof(*t)};
  if (name) {
    long i = cases_find(c, name);
    return i < 0 ? 2 : t[i].run();
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    int r = t[i].run();
    if (rc == 0)
      rc = r;
  }
  return rc;
}

#ifdef cmocka_unit_test
_Static_assert(offsetof(struct CMUnitTest, name) == 0, "a CMUnitTest starts with its name");

/* Run the test called name as its group (every test when name is NULL),
 * with cmocka's own output and exit status; 2 if there is no such test
 * (cmocka's own filter would run none and pass). */
static inline int cases_run_cmocka(const char *group, const struct CMUnitTest *tests, size_t n,
                                   const char *name, CMFixtureFunction setup,
                                   CMFixtureFunction teardown)
{
  if (name == NULL)
    return _cmocka_run_group_tests(group, tests, n, setup, teardown);
  long i = cases_find((struct cases){tests, n, sizeof(*tests)}, name);
  if (i < 0)
    return 2;
  return _cmocka_run_group_tests(group, &tests[i], 1, setup, teardown);
}
#endif

#endif
