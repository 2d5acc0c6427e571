/* SPDX-License-Identifier: MIT */
/*
 * The attacker of tests/hostile/fabric_data.c: a process that never opens
 * hixl's control port.  It opens its own libfabric RDM endpoint with the
 * target's provider, puts the target's endpoint name in its address vector
 * and
 *   rma:   tries fi_read and fi_write with keys 1..64 at offset 0 and at each
 *          address it is given (the regions' virtual addresses);
 *   notif: sends hixl notification messages claiming to come from a given
 *          context id (a legitimate, connected peer's).
 * Linked with libfabric itself (hixl only dlopens it); no hixl headers.
 * Prints what it achieved; exits 0 when it ran, 2 when it could not set up.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "fabric_attacker.h"

static struct fid_fabric *fab;
static struct fid_domain *dom;
static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_av *av;
static fi_addr_t target;
static struct fi_info *info;

static int64_t now_ms(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int setup(const char *prov, const uint8_t *addr)
{
  struct fi_info *h = fi_allocinfo();
  h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_SEND | FI_RECV;
  h->ep_attr->type = FI_EP_RDM;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->fabric_attr->prov_name = strdup(prov);
  struct fi_info *all = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 14), NULL, NULL, 0, h, &all);
  fi_freeinfo(h);
  if (rc)
    return fprintf(stderr, "attacker: fi_getinfo: %s\n", fi_strerror(-rc)), -1;
  for (struct fi_info *i = all; i && !info; i = i->next)
    if (strcmp(i->fabric_attr->prov_name, prov) == 0)
      info = fi_dupinfo(i);
  fi_freeinfo(all);
  if (!info)
    return fprintf(stderr, "attacker: no %s\n", prov), -1;
  struct fi_cq_attr cqa = {.size = 1024, .format = FI_CQ_FORMAT_CONTEXT};
  struct fi_av_attr ava = {.type = FI_AV_TABLE};
  if (fi_fabric(info->fabric_attr, &fab, NULL) || fi_domain(fab, info, &dom, NULL) ||
      fi_cq_open(dom, &cqa, &cq, NULL) || fi_av_open(dom, &ava, &av, NULL) ||
      fi_endpoint(dom, info, &ep, NULL) || fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) ||
      fi_ep_bind(ep, &av->fid, 0) || fi_enable(ep))
    return fprintf(stderr, "attacker: opening the endpoint failed\n"), -1;
  if (fi_av_insert(av, addr, 1, &target, 0, NULL) != 1)
    return fprintf(stderr, "attacker: fi_av_insert failed\n"), -1;
  return 0;
}

/* Completions until the deadline: contexts of successful ones are counted. */
static int ok_reads, ok_writes;
static struct fi_context2 ctxs[2][65][17];
static uint8_t rbuf[65][17][64];

static void reap(int64_t until)
{
  struct fi_cq_entry e[16];
  while (now_ms() < until) {
    ssize_t n = fi_cq_read(cq, e, 16);
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(cq, &err, 0);
      continue;
    }
    for (ssize_t i = 0; i < n; i++) {
      struct fi_context2 *c = e[i].op_context;
      if (c >= &ctxs[0][0][0] && c < &ctxs[1][0][0])
        ok_reads++;
      else if (c >= &ctxs[1][0][0] && c <= &ctxs[1][64][16])
        ok_writes++;
    }
  }
}

/* 1: the completion of a blocking op (notif) came without error. */
static int wait_one(int ms)
{
  int64_t end = now_ms() + ms;
  struct fi_cq_entry e;
  while (now_ms() < end) {
    ssize_t n = fi_cq_read(cq, &e, 1);
    if (n == 1)
      return 1;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(cq, &err, 0);
      return 0;
    }
  }
  return 0;
}

/* fi_send, retried while EAGAIN for up to 5 s: a connection rxm cannot
 * make (another eager limit) keeps it at EAGAIN forever, and the test
 * would wait on us forever. */
static ssize_t send_bounded(const void *m, size_t len)
{
  int64_t give_up = now_ms() + 5000;
  ssize_t rc;
  while ((rc = fi_send(ep, m, len, NULL, target, NULL)) == -FI_EAGAIN && now_ms() < give_up)
    fi_cq_read(cq, NULL, 0);
  return rc;
}

static int rma(int n_addrs, const uint64_t *addrs)
{
  static uint8_t wbuf[64];
  memset(wbuf, 0xEE, sizeof(wbuf));
  struct fid_mr *mr = NULL, *wmr = NULL;
  void *desc = NULL, *wdesc = NULL;
  if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
    if (fi_mr_reg(dom, rbuf, sizeof(rbuf), FI_READ | FI_WRITE, 0, 77, 0, &mr, NULL) ||
        fi_mr_reg(dom, wbuf, sizeof(wbuf), FI_READ | FI_WRITE, 0, 78, 0, &wmr, NULL))
      return fprintf(stderr, "attacker: fi_mr_reg failed\n"), -1;
    desc = fi_mr_desc(mr);
    wdesc = fi_mr_desc(wmr);
  }
  /* First a message the target drops (no magic): its completion says
   * the connection is up, so the failures below are the target's refusals
   * and not a connection rxm never made. */
  attacker_msg_t probe = {0};
  int connected = send_bounded(&probe, sizeof(probe)) == 0 && wait_one(5000);
  int tries = 0;
  if (!connected) { /* nothing below could tell a refusal from no connection */
    printf("connected 0 tries 0 reads 0 writes 0 landed 0\n");
    return 0;
  }
  /* Every key at every offset, a read and a write each: posted a key at a
   * time, completions reaped for 150 ms (failures may never complete). */
  for (int key = 1; key <= 64; key++) {
    for (int a = 0; a <= n_addrs && a < 17; a++) {
      uint64_t off = a == 0 ? 0 : addrs[a - 1];
      ssize_t rc;
      tries++;
      for (int t = 0; t < 100 && (rc = fi_read(ep, rbuf[key][a], 64, desc, target, off,
                                               (uint64_t)key, &ctxs[0][key][a])) == -FI_EAGAIN;
           t++)
        reap(now_ms() + 1);
      for (int t = 0; t < 100 && (rc = fi_write(ep, wbuf, 64, wdesc, target, off, (uint64_t)key,
                                                &ctxs[1][key][a])) == -FI_EAGAIN;
           t++)
        reap(now_ms() + 1);
    }
    reap(now_ms() + 150);
  }
  reap(now_ms() + 500);
  /* A read that landed shows in its buffer even without a completion. */
  int landed = 0;
  for (int key = 1; key <= 64; key++)
    for (int a = 0; a < 17; a++)
      for (int b = 0; b < 64; b++)
        if (rbuf[key][a][b]) {
          landed++;
          fprintf(stderr, "attacker: read key %d at offset #%d: %02x\n", key, a, rbuf[key][a][b]);
          break;
        }
  printf("connected %d tries %d reads %d writes %d landed %d\n", connected, tries, ok_reads,
         ok_writes, landed);
  if (mr)
    fi_close(&mr->fid);
  if (wmr)
    fi_close(&wmr->fid);
  return ok_reads + ok_writes + landed;
}

static int notif(uint64_t sender, int count)
{
  int sent = 0;
  for (int i = 0; i < count; i++) {
    /* The cookie is unknown: try zero, the sender id, and small values. */
    attacker_msg_t m = {.magic = ATTACKER_MSG_MAGIC,
                        .imm = ATTACKER_IMM_BASE + (uint32_t)i,
                        .len = 0,
                        .sender = sender,
                        .cookie = i % 3 == 0   ? 0
                                  : i % 3 == 1 ? sender
                                               : (uint64_t)i};
    if (send_bounded(&m, sizeof(m)) == 0 && wait_one(2000))
      sent++;
  }
  printf("sent %d\n", sent);
  return 0;
}

int attacker_main(int argc, char **argv)
{
  /* argv: attacker rma|notif PROV HEXADDR [ADDR... | SENDER COUNT] */
  /* rxm connects only endpoints of the same eager limit, and hixl uses
   * 1 KiB (docs/scale.md): an attacker knows it and matches it. */
  setenv("FI_OFI_RXM_BUFFER_SIZE", "1024", 0);
  if (argc < 5)
    return 2;
  size_t alen = strlen(argv[3]) / 2;
  uint8_t addr[256] = {0};
  for (size_t i = 0; i < alen && i < sizeof(addr); i++)
    sscanf(argv[3] + 2 * i, "%2hhx", &addr[i]);
  if (setup(argv[2], addr) != 0)
    return 2;
  int rc = 0;
  if (strcmp(argv[1], "rma") == 0) {
    uint64_t addrs[16];
    int n = 0;
    for (int i = 4; i < argc && n < 16; i++)
      addrs[n++] = strtoull(argv[i], NULL, 0);
    rc = rma(n, addrs) < 0 ? 2 : 0;
  } else if (argc >= 6) {
    rc = notif(strtoull(argv[4], NULL, 0), atoi(argv[5]));
  } else {
    rc = 2;
  }
  fflush(stdout);
  fi_close(&ep->fid);
  fi_close(&av->fid);
  fi_close(&cq->fid);
  fi_close(&dom->fid);
  fi_close(&fab->fid);
  fi_freeinfo(info);
  return rc;
}
