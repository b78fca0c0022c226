-- wrk: rate `try` decisions, one POST per request on keep-alive connections.
wrk.method = "POST"
wrk.path = "/v1/rates/bench-http-rate/try"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"limits": ["50/s", "1000/min"]}'

local errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("JSON {\"requests\": %d, \"seconds\": %.3f, \"per_sec\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, \"non_2xx\": %d}\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.status))
end
