#!/usr/bin/env bash
# hixl-info --serve and --peer (docs/observability.md#hixl-info-as-a-doctor),
# on this machine: a --serve context on 127.0.0.1, port 0, then --peer
# against it: exit 0, the transport chosen, a line for every other
# transport (why it was not chosen), the control and data round trips and
# the put/get check; against a port nothing listens on: exit 1 with the
# library's connect hint; with another auth token: exit 1, the token
# mentioned and never printed; bad options: exit 2.  No timing is checked
# (it must pass on a busy machine).  Usage: hixl_info_peer.sh HIXL_INFO
set -u
info=$1
dir=$(mktemp -d)
out=$dir/out
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  if [ -s "$out" ]; then
    echo "--- output:"
    cat "$out"
  fi
  exit 1
}

# serve NAME COMMAND...: starts a --serve context in the background; sets
# addr (its first line) and spid.
serve() {
  local name=$1
  shift
  "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  spid=$!
  pids+=("$spid")
  addr=""
  for _ in $(seq 400); do
    if [ "$(wc -l <"$dir/$name.out")" -ge 1 ]; then
      addr=$(head -n 1 "$dir/$name.out")
      break
    fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "$addr" ] || { cat "$dir/$name.err"; fail "the $name server printed no address"; }
}

# --- a reachable target that publishes the probe region
serve main "$info" --serve 127.0.0.1:0 --for 300
main_pid=$spid
case "$addr" in
  127.0.0.1:[0-9]*) ;;
  *) fail "--serve 127.0.0.1:0 printed \"$addr\", not 127.0.0.1:PORT" ;;
esac
"$info" --peer "$addr" >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "--peer $addr exited $rc"
chosen=$(sed -n 's/^\[ok  \] connected in .* ms; transport \([a-z]*\) .*/\1/p' "$out")
[ -n "$chosen" ] || fail "no \"connected ...; transport NAME\" line"
for t in self shm verbs fabric; do
  [ "$t" = "$chosen" ] && continue
  grep -qE "^\[(ok  |note)\] $t: " "$out" || fail "no line says why $t was not chosen"
done
grep -q '^\[ok  \] control round trip (hixl_peer_remote_stats, [0-9]* times): min [0-9.]* us, median [0-9.]* us$' "$out" ||
  fail "no control round trip line"
grep -q '^\[ok  \] put 4096 bytes to "hixl-info.probe" (offset [0-9]*) and got them back: identical$' "$out" ||
  fail "the put/get check did not say ok"
grep -q '^\[ok  \] data round trip, 8-byte get to completion (100 gets): min [0-9.]* us, median [0-9.]* us$' "$out" ||
  fail "no data round trip line"
grep -q '^0 problem(s)' "$out" || fail "problems counted on a run that worked"

# --- the same target gone: nothing listens on its port any more
kill "$main_pid"
wait "$main_pid"
rc=$?
[ "$rc" -eq 0 ] || fail "--serve exited $rc on SIGTERM, not 0"
"$info" --peer "$addr" --timeout 5000 >"$out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "--peer to a port nothing listens on exited $rc, not 1"
grep -q '^\[FAIL\] hixl_connect: ' "$out" || fail "the connect failure is not a FAIL line"
grep -qF "is the target running" "$out" || fail "the connect hint is missing"

# --- another auth token (HIXL_LISTEN instead of the argument, this time)
srv_token=hixl-info-test-server-token-0123456789
cli_token=hixl-info-test-client-token-9876543210
serve auth env HIXL_LISTEN=127.0.0.1:0 HIXL_AUTH_TOKEN="$srv_token" "$info" --serve --for 300
HIXL_AUTH_TOKEN="$cli_token" "$info" --peer "$addr" --timeout 5000 >"$out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "--peer with another auth token exited $rc, not 1"
grep -qi "token" "$out" || fail "the auth failure does not mention the token"
if grep -qF -e "$srv_token" -e "$cli_token" "$out"; then
  fail "a token was printed"
fi
HIXL_AUTH_TOKEN="$srv_token" "$info" --peer "$addr" >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "--peer with the target's auth token exited $rc"
grep -qF -e "$srv_token" "$out" && fail "the token was printed"

# --- --for ends the server by itself
timeout 30 "$info" --serve 127.0.0.1:0 --for 0.2 >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "--serve --for 0.2 exited $rc"

# --- usage errors
: >"$out"
for args in "--peer" "--peer 127.0.0.1:1 --serve" "--for 3" "--peer 127.0.0.1:1 --watch" \
            "--serve --for x" "--bogus"; do
  # shellcheck disable=SC2086
  "$info" $args >/dev/null 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || fail "hixl-info $args exited $rc, not 2"
done
echo "ok"
