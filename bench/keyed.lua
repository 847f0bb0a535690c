-- wrk script for bench/proxy.sh: keyed POSTs with a fixed JSON body.
--
-- Environment: BENCH_BODY (file with the request body), BENCH_KEYS (number of distinct routing keys),
-- BENCH_PATH (request path), BENCH_OUT (file the summary is written to, as JSON).
-- Every request carries `X-SMG-Routing-Key: key-<n>`; each wrk thread walks the keys from its own
-- offset so the connections spread over the whole key space. Requests are formatted once, in init.

local threads = {}
local counter = 0

function setup(thread)
  thread:set("thread_index", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
  local body = f:read("*a")
  f:close()
  local keys = tonumber(os.getenv("BENCH_KEYS") or "1000")
  local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
  requests = {}
  for i = 1, keys do
    requests[i] = wrk.format("POST", path, {
      ["Content-Type"] = "application/json",
      ["X-SMG-Routing-Key"] = "key-" .. (i - 1),
    }, body)
  end
  nkeys = keys
  -- 7919 is prime: thread offsets land on different keys whatever the thread count.
  position = (thread_index * 7919) % keys
end

function request()
  position = position + 1
  if position > nkeys then position = 1 end
  return requests[position]
end

function done(summary, latency, requests)
  local out = assert(io.open(os.getenv("BENCH_OUT"), "w"))
  local e = summary.errors
  out:write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
  out:close()
end
