"""Drives the sidecar's /llm relay with the real `openai` SDK.

Usage: llm_openai.py BASE_URL API_KEY
Prints one JSON document: what the SDK got back (text, usage, chunk
arrival times in Unix ms, every response header), for the Rust test to judge.
"""

import json
import sys
import time

import openai


def now_ms():
    return time.time() * 1000.0


def main():
    base_url, api_key = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    msgs = [{"role": "user", "content": "say hello"}]
    out = {"sdk": openai.__version__, "headers": []}

    raw = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=msgs)
    out["headers"].append(dict(raw.headers))
    chat = raw.parse()
    out["chat"] = {
        "content": chat.choices[0].message.content,
        "model": chat.model,
        "usage": [chat.usage.prompt_tokens, chat.usage.completion_tokens],
    }

    def stream(**extra):
        started = now_ms()
        raw = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=msgs, stream=True, **extra)
        out["headers"].append(dict(raw.headers))
        arrivals, text, usage, usage_only = [], "", None, 0
        for chunk in raw.parse():
            arrivals.append(now_ms())
            if chunk.usage is not None:
                usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
            if not chunk.choices:
                usage_only += 1
            else:
                text += chunk.choices[0].delta.content or ""
        return {"started": started, "arrivals": arrivals, "content": text, "usage": usage, "usage_only_chunks": usage_only}

    out["stream"] = stream()
    out["stream_with_usage"] = stream(stream_options={"include_usage": True})

    resp = client.responses.create(model="gpt-fake", input="say hello")
    out["responses"] = {"text": resp.output_text, "usage": [resp.usage.input_tokens, resp.usage.output_tokens]}

    arrivals, text, usage = [], "", None
    for ev in client.responses.create(model="gpt-fake", input="say hello", stream=True):
        arrivals.append(now_ms())
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type == "response.completed":
            usage = [ev.response.usage.input_tokens, ev.response.usage.output_tokens]
    out["responses_stream"] = {"arrivals": arrivals, "content": text, "usage": usage}

    out["models"] = [m.id for m in client.models.list()]

    # An endpoint the relay does not serve comes back as an API error, not a crash.
    try:
        client.files.list()
        out["files"] = "allowed"
    except openai.APIStatusError as e:
        out["files"] = e.status_code

    print(json.dumps(out))


if __name__ == "__main__":
    main()
