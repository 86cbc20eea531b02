"""An agent that opens a model stream with the real `anthropic` SDK, reads a
few events, closes the stream and exits (without reading to the end).

Usage: llm_hangup.py BASE_URL API_KEY MODEL N
Prints one JSON document: the types of the events it read.
"""

import json
import sys

import anthropic


def main():
    base_url, api_key, model, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    stream = client.messages.create(
        model=model,
        max_tokens=64,
        messages=[{"role": "user", "content": "say hello"}],
        stream=True,
    )
    seen = []
    for event in stream:
        seen.append(event.type)
        if len(seen) >= n:
            break
    stream.close()
    print(json.dumps({"events": seen}))


if __name__ == "__main__":
    main()
