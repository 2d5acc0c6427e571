/* SPDX-License-Identifier: MIT */
/* Every transport's ops table (hixl__transports[], and the table a
 * disconnected peer gets) is whole: its size is this build's, its name and
 * id are its own, and every slot the core calls without looking is filled.
 * The guard that -Wmissing-field-initializers would be, had meson.build not
 * switched it off (it also fires on the positional initializers of system
 * structs); a slot added to hixl_transport_ops_t goes into `required` or
 * `optional` below, or this test fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "core.h"

typedef struct slot {
  const char *name;
  size_t off;
} slot_t;
#define SLOT(f)                                                                                    \
  {                                                                                                \
#f, offsetof(hixl_transport_ops_t, f)                                                          \
  }

/* Called unconditionally by the core. */
static const slot_t required[] = {
    SLOT(ctx_init), SLOT(ctx_fini), SLOT(mr_reg),     SLOT(mr_dereg),   SLOT(usable),
    SLOT(connect),  SLOT(accept),   SLOT(peer_close), SLOT(rmr_attach), SLOT(rmr_detach),
    SLOT(rmr_live), SLOT(put),      SLOT(get),        SLOT(put_imm),    SLOT(notify),
    SLOT(atomic),   SLOT(progress), SLOT(on_event),
};
/* Looked at before each call (NULL: the core's default). */
static const slot_t optional[] = {
    SLOT(peer_lost),  SLOT(batch),          SLOT(arm),    SLOT(arm_words), SLOT(ack_event),
    SLOT(notif_poll), SLOT(notif_consumed), SLOT(mr_key), SLOT(probe),     SLOT(peer_alive),
    SLOT(stats),
};

static void *slot_at(const hixl_transport_ops_t *o, size_t off)
{
  void *p;
  memcpy(&p, (const char *)o + off, sizeof(p));
  return p;
}

/* Every function-pointer slot of the struct is in one of the two lists:
 * the pointers tile the struct from the first slot to its end. */
static void test_every_slot_is_listed(void **state)
{
  (void)state;
  size_t first = offsetof(hixl_transport_ops_t, ctx_init);
  size_t n = sizeof(required) / sizeof(required[0]) + sizeof(optional) / sizeof(optional[0]);
  assert_int_equal((sizeof(hixl_transport_ops_t) - first) / sizeof(void (*)(void)), n);
  for (size_t off = first; off < sizeof(hixl_transport_ops_t); off += sizeof(void *)) {
    bool found = false;
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
      found |= required[i].off == off;
    for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++)
      found |= optional[i].off == off;
    if (!found)
      fail_msg("the ops slot at offset %zu is in neither list", off);
  }
}

static void check_table(const hixl_transport_ops_t *o, bool closed)
{
  assert_non_null(o);
  assert_non_null(o->name);
  if (o->size != sizeof(hixl_transport_ops_t))
    fail_msg("transport %s: size %zu, this build's ops table has %zu", o->name, o->size,
             sizeof(hixl_transport_ops_t));
  for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
    if (slot_at(o, required[i].off) == NULL)
      fail_msg("transport %s: required slot %s is NULL", o->name, required[i].name);
  if ((o->arm == NULL) != (o->ack_event == NULL))
    fail_msg("transport %s: arm and ack_event come together", o->name);
  if (o->arm_words && !o->arm)
    fail_msg("transport %s: arm_words needs arm (the fds when words cannot do)", o->name);
  if (closed)
    return;
  if (o->id < 0 || o->id >= HIXL_TP_MAX)
    fail_msg("transport %s: id %d outside [0, %d)", o->name, o->id, HIXL_TP_MAX);
  if (hixl__tp_names[o->id] == NULL || strcmp(o->name, hixl__tp_names[o->id]) != 0)
    fail_msg("transport %s: hixl__tp_names[%d] says %s", o->name, o->id,
             hixl__tp_names[o->id] ? hixl__tp_names[o->id] : "nothing");
  /* A lazy transport is probed at hixl_ctx_create, and nothing else is. */
  if (((o->caps & HIXL_TP_CAP_LAZY) != 0) != (o->probe != NULL))
    fail_msg("transport %s: probe is set exactly when the transport is lazy", o->name);
  if ((o->caps & HIXL_TP_CAP_LAZY) && (o->caps & HIXL_TP_CAP_LOOPBACK))
    fail_msg("transport %s: the loopback is always set up", o->name);
  if (o->bind_fds > 4) /* HIXL_CTL_MAX_FDS (conn.h) */
    fail_msg("transport %s: a bind passes at most 4 fds", o->name);
  if (o->bind_unix && (!o->needs_bind || o->bind_fds == 0))
    fail_msg("transport %s: a unix bind needs needs_bind and its fds", o->name);
  for (const hixl_tp_msg_t *m = o->msgs; m && m->kind; m++) {
    for (const hixl_tp_msg_t *n = o->msgs; n < m; n++)
      if (n->kind == m->kind)
        fail_msg("transport %s: two own messages of kind %u", o->name, m->kind);
    if (m->serve == NULL)
      fail_msg("transport %s: own message kind %u has no serve", o->name, m->kind);
    if (m->req_fds != 0 || m->reply_fds > 1)
      fail_msg("transport %s: own message kind %u passes fds the core does not deliver", o->name,
               m->kind);
  }
}

static void test_tables_are_whole(void **state)
{
  (void)state;
  assert_true(hixl__n_transports >= 2); /* self and shm are always built */
  for (size_t t = 0; t < hixl__n_transports; t++) {
    const hixl_transport_ops_t *o = hixl__transports[t];
    check_table(o, false);
    for (size_t u = 0; u < t; u++) {
      if (hixl__transports[u]->id == o->id)
        fail_msg("transports %s and %s share id %d", hixl__transports[u]->name, o->name, o->id);
      if (strcmp(hixl__transports[u]->name, o->name) == 0)
        fail_msg("two transports are named %s", o->name);
    }
  }
  check_table(&hixl__closed_ops, true);
  /* Exactly one loopback (the self peer a context makes to itself). */
  int loop = 0;
  for (size_t t = 0; t < hixl__n_transports; t++)
    loop += (hixl__transports[t]->caps & HIXL_TP_CAP_LOOPBACK) != 0;
  assert_int_equal(loop, 1);
  assert_non_null(hixl__tp_loopback());
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_slot_is_listed),
      cmocka_unit_test(test_tables_are_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
