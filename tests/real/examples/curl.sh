GW=http://127.0.0.1:8080
MODEL=$(curl -s $GW/v1/models | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
# not streaming; -i shows x-bch-worker (who served it) and x-bch-branch (why)
curl -si -w '\n' $GW/v1/chat/completions \
  -H 'X-SMG-Routing-Key: session-42' -H 'content-type: application/json' \
  -d '{"model":"'"$MODEL"'","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
# streaming: the server-sent events pass through chunk by chunk
curl -siN $GW/v1/chat/completions \
  -H 'X-SMG-Routing-Key: session-42' -H 'content-type: application/json' \
  -d '{"model":"'"$MODEL"'","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"stream":true}'
