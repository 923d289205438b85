"""Talks to a mindxtrain node with the official OpenAI Python client and prints what it saw.

usage: python openai_client.py BASE_URL MODEL [API_KEY]
One JSON object on stdout: the model list, a whole completion, the same request streamed,
a stop sequence, and the error a wrong model name gets.
"""
import json
import sys

import openai
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key=sys.argv[3] if len(sys.argv) > 3 else "not-needed", max_retries=0)
ask = dict(model=model, messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=24, temperature=0, seed=1)
out = {"models": [m.id for m in client.models.list().data], "retrieved": client.models.retrieve(model).id}

r = client.chat.completions.create(**ask)
out["text"] = r.choices[0].message.content
out["finish"] = r.choices[0].finish_reason
out["usage"] = r.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
out["object"] = r.object

parts, finish, usage, roles = [], None, None, []
for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
    if chunk.choices:
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        if delta.content:
            parts.append(delta.content)
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
out["stream_text"] = "".join(parts)
out["stream_pieces"] = len(parts)
out["stream_finish"] = finish
out["stream_usage"] = usage
out["stream_roles"] = roles

if len(out["text"]) >= 2:
    stop = out["text"][1:3]
    s = client.chat.completions.create(**ask, stop=[stop])
    out["stop"] = {"sequence": stop, "text": s.choices[0].message.content, "finish": s.choices[0].finish_reason}

try:
    client.chat.completions.create(**{**ask, "model": "no-such-model"})
    out["wrong_model"] = "accepted"
except openai.NotFoundError as e:
    out["wrong_model"] = {"status": e.status_code, "code": e.code}
print(json.dumps(out))
