"""A client of the server examples/serve.sh starts: completions and chat, streamed and not.

python examples/client.py [--base-url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id
    done = client.completions.create(
        model=model, prompt="The history of the city", max_tokens=24, temperature=0
    )
    print("completion:", repr(done.choices[0].text))
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    print("chat:", repr(chat.choices[0].message.content))
    print("streamed: ", end="")
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, stream=True
    ):
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()


if __name__ == "__main__":
    main()
