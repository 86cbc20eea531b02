"""Asks for embeddings of a whole batch with the real `openai` SDK.

Usage: llm_embeddings.py BASE_URL API_KEY N DIMENSIONS
Prints one JSON document: how many vectors came back, their length, a
checksum of their values, and the usage the SDK read.
"""

import json
import sys

import openai


def main():
    base_url, api_key, n, dims = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    inputs = [f"document number {i}" for i in range(n)]
    resp = client.embeddings.create(model="text-embedding-fake", input=inputs, dimensions=dims)
    vectors = [d.embedding for d in resp.data]
    print(
        json.dumps(
            {
                "count": len(vectors),
                "dims": sorted({len(v) for v in vectors}),
                "checksum": round(sum(sum(v) for v in vectors), 1),
                "usage": [resp.usage.prompt_tokens, resp.usage.total_tokens],
            }
        )
    )


if __name__ == "__main__":
    main()
