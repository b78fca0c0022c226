-- wrk (1 thread, 1 connection): acquire a permit, then release it by its lease id, in a
-- loop; a pair is two requests. Capacity 10, as the library's W1.
local lease = nil
local acquire = wrk.format("POST", "/v1/semaphores/bench-http-w1/acquire",
  {["Content-Type"] = "application/json"}, '{"capacity": 10, "ttl": "30s"}')

function request()
  if lease then
    return wrk.format("DELETE", "/v1/semaphores/bench-http-w1/leases/" .. lease)
  end
  return acquire
end

function response(status, headers, body)
  if lease then
    lease = nil
  elseif status == 200 then
    lease = string.match(body, '"lease_id":"(%x+)"')
  end
end

function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  io.write(string.format("JSON {\"requests\": %d, \"seconds\": %.3f, \"pairs_per_sec\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"non_2xx\": %d}\n",
    summary.requests, secs, summary.requests / 2 / secs,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.errors.status))
end
