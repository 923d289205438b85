"""What the official OpenAI Python client sees of a node whose recipe sets serve.tool_calls: true.

usage: python openai_contract.py BASE_URL MODEL
One JSON object on stdout: how each refused parameter surfaces (openai.BadRequestError, its
param and code), that the values which change nothing are served, the prompt sizes with and
without tools, a conversation with a tool call and its result, that answer streamed, and the
error of a route the node does not serve.
"""
import json
import sys

import openai
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0)
user = [{"role": "user", "content": "What is the weather in Paris?"}]
ask = dict(model=model, messages=user, max_tokens=8, temperature=0, seed=1)
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
out = {}


def refusal(**kwargs):
    try:
        client.chat.completions.create(**{**ask, **kwargs})
        return "accepted"
    except openai.BadRequestError as e:
        return {"status": e.status_code, "param": e.param, "code": e.code, "message": e.message}


out["refused"] = {
    "presence_penalty": refusal(presence_penalty=0.5),
    "response_format": refusal(response_format={"type": "json_object"}),
    "logit_bias": refusal(logit_bias={"42": 5}),
    "min_p": refusal(extra_body={"min_p": 0.1}),
    "frobnicate": refusal(extra_body={"frobnicate": 1}),
    "tool_choice": refusal(tools=tools, tool_choice="required"),
}

neutral = client.chat.completions.create(
    **ask, presence_penalty=0, frequency_penalty=0, logit_bias={}, n=1, logprobs=False,
    response_format={"type": "text"}, extra_body={"repetition_penalty": 1, "top_k": -1, "chat_template_kwargs": {}},
)
out["neutral"] = {"object": neutral.object, "finish": neutral.choices[0].finish_reason}


def prompt_tokens(**kwargs):
    return client.chat.completions.create(**{**ask, **kwargs}).usage.prompt_tokens


out["prompt_tokens"] = {
    "plain": prompt_tokens(),
    "tools": prompt_tokens(tools=tools),
    "tools_none": prompt_tokens(tools=tools, tool_choice="none"),
}

conversation = user + [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
    }]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]
r = client.chat.completions.create(**{**ask, "messages": conversation}, tools=tools, tool_choice="auto")
message = r.choices[0].message
out["answered"] = {
    "status": "ok",
    "role": message.role,
    "content": message.content,
    "tool_calls": [c.model_dump() for c in message.tool_calls or []],
    "finish": r.choices[0].finish_reason,
    "prompt_tokens": r.usage.prompt_tokens,
    "completion_tokens": r.usage.completion_tokens,
}

parts, calls, finish = [], [], None
for chunk in client.chat.completions.create(**{**ask, "messages": conversation}, tools=tools, stream=True):
    if chunk.choices:
        delta = chunk.choices[0].delta
        parts.append(delta.content or "")
        calls.extend(c.model_dump() for c in delta.tool_calls or [])
        finish = chunk.choices[0].finish_reason or finish
out["streamed"] = {"content": "".join(parts), "tool_calls": calls, "finish": finish}

try:
    client.embeddings.create(model=model, input="hi")
    out["unknown_route"] = "accepted"
except openai.NotFoundError as e:
    out["unknown_route"] = {"status": e.status_code, "code": e.code, "param": e.param}
print(json.dumps(out))
