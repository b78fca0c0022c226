#!/bin/sh
# Send messages within 50 calls per second and 1,000 per minute, shared by every process
# that runs this script (on any host), through `tessera serve`. Needs curl.
#
#   TESSERA_URL=http://127.0.0.1:8080 ./send_sms.sh 100
#
# Each turn is reserved by the server; the answer comes when the turn does (up to max_wait),
# otherwise 429 with Retry-After (whole seconds) and the exact wait in retry_after_ms.
# With SMS_PROVIDER_URL set, each message is a POST there (scripts/fake-provider.py counts
# calls as the provider would); otherwise it is only printed. These turns hold no permit:
# for "at most 4 in flight" too, take admissions (/v1/admissions, docs/http.md).
set -eu
url=${TESSERA_URL:-http://127.0.0.1:8080}
count=${1:-10}
auth=${TESSERA_TOKEN:+Authorization: Bearer $TESSERA_TOKEN}

turn() {
  tries=0
  while :; do
    code=$(curl -s -o /dev/null -w '%{http_code}' ${auth:+-H "$auth"} \
      -H 'Content-Type: application/json' \
      -d '{"limits": ["50/s", "1000/min"], "max_wait": "5s"}' \
      "$url/v1/rates/sms-api/acquire") || true
    case $code in
      200) return 0 ;;
      429) sleep 1 ;;                  # limited beyond max_wait: nothing charged
      000 | 503)                       # no answer, or no store: a server restarting?
        tries=$((tries + 1))
        [ "$tries" -lt 5 ] || { echo "send_sms.sh: tessera answered $code" >&2; return 1; }
        sleep 1 ;;
      *) echo "send_sms.sh: tessera answered $code" >&2; return 1 ;;
    esac
  done
}

i=0
while [ "$i" -lt "$count" ]; do
  turn
  start=$(date +%s.%N) refused=
  if [ -n "${SMS_PROVIDER_URL:-}" ]; then # the call to the messaging API
    sent=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
      -d "{\"sender\": \"sh:$$\", \"message\": $i}" "$SMS_PROVIDER_URL")
    [ "$sent" = 200 ] || refused=" refused $sent"
  fi
  echo "$start pid $$ message $i$refused"
  i=$((i + 1))
done
