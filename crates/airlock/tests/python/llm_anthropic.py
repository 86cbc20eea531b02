"""Drives the sidecar's /llm relay with the real `anthropic` SDK.

Usage: llm_anthropic.py BASE_URL SIDECAR_TOKEN
The non-streaming call runs as an agent behind the runtime would: a
placeholder key, the token in `x-airlock-sidecar-auth`. The streaming call
uses the token itself as the SDK's key. Prints one JSON document.
"""

import json
import sys
import time

import anthropic

PLACEHOLDER = "sk-ant-placeholder-not-a-key"


def now_ms():
    return time.time() * 1000.0


def main():
    base_url, token = sys.argv[1], sys.argv[2]
    msgs = [{"role": "user", "content": "say hello"}]
    out = {"sdk": anthropic.__version__, "headers": []}

    behind_runtime = anthropic.Anthropic(
        base_url=base_url,
        api_key=PLACEHOLDER,
        default_headers={"x-airlock-sidecar-auth": token},
        max_retries=0,
        timeout=30,
    )
    raw = behind_runtime.messages.with_raw_response.create(model="claude-fake", max_tokens=64, messages=msgs)
    out["headers"].append(dict(raw.headers))
    msg = raw.parse()
    out["message"] = {
        "content": msg.content[0].text,
        "model": msg.model,
        "usage": [msg.usage.input_tokens, msg.usage.output_tokens],
    }

    direct = anthropic.Anthropic(base_url=base_url, api_key=token, max_retries=0, timeout=30)
    started = now_ms()
    raw = direct.messages.with_raw_response.create(model="claude-fake", max_tokens=64, messages=msgs, stream=True)
    out["headers"].append(dict(raw.headers))
    arrivals, text, usage_in, usage_out = [], "", None, None
    for ev in raw.parse():
        arrivals.append(now_ms())
        if ev.type == "message_start":
            usage_in = ev.message.usage.input_tokens
        elif ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text += ev.delta.text
        elif ev.type == "message_delta":
            usage_out = ev.usage.output_tokens
    out["stream"] = {"started": started, "arrivals": arrivals, "content": text, "usage": [usage_in, usage_out]}

    # The SDK's own stream helper, end to end.
    with direct.messages.stream(model="claude-fake", max_tokens=64, messages=msgs) as s:
        final = s.get_final_message()
    out["stream_helper"] = {"content": final.content[0].text, "usage": [final.usage.input_tokens, final.usage.output_tokens]}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
