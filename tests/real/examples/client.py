from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="unused")
model = client.models.list().data[0].id  # llama-cpp-python's: --model_alias, else the GGUF path
session = {"X-SMG-Routing-Key": "session-42"}
messages = [{"role": "user", "content": "Say hello."}]

# not streaming; with_raw_response exposes the gateway's headers
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=messages, max_tokens=16, extra_headers=session
)
print(raw.headers["x-bch-worker"], raw.headers["x-bch-branch"])
print(raw.parse().choices[0].message.content)

# streaming
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=16, stream=True, extra_headers=session
)
print(stream.response.headers["x-bch-worker"], stream.response.headers["x-bch-branch"])
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()
