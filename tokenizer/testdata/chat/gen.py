# Renders the chat-template fixtures with Python Jinja2 the way transformers does; writes expected.json.
import json
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

specials = {
    "deepseek_v3": dict(bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>", pad_token="<｜end▁of▁sentence｜>"),
    "qwen3": dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    "llama3": dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
    "llama31": dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
    "llama2": dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
}


def render(src, messages, agp, sp):
    try:
        t = env.from_string(src)
        return {"ok": True, "text": t.render(messages=messages, tools=None, documents=None, add_generation_prompt=agp, **sp)}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


convs = json.load(open("convs.json"))
out = {"templates": {}, "features": []}
for name, sp in specials.items():
    src = open(f"{name}.jinja").read()
    out["templates"][name] = {"specials": sp, "results": [render(src, c, agp, sp) for c in convs for agp in (False, True)]}
feat_msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
for src in json.load(open("features.json")):
    r = render(src, feat_msgs, True, {"bos_token": "<s>"})
    r["template"] = src
    out["features"].append(r)
json.dump(out, open("expected.json", "w"), ensure_ascii=False, indent=1)
