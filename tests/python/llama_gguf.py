"""A tiny GGUF model that a real llama.cpp `llama-server` loads and serves, for the tests.

    python tests/python/llama_gguf.py /tmp/tiny.gguf

Architecture "llama": 2 layers, 64-dim embeddings, 4 heads (2 KV heads), random weights from a
fixed seed, all f32 (about 0.2 MB). The tokenizer is byte-level BPE ("gpt2", pre-tokenizer
"qwen2"): the 256 byte tokens (ids 0-255, id = byte value) tokenize any UTF-8 input, a few
merges make common pairs one token, and the ChatML specials follow:

    <|endoftext|>  BOS (added at the start of every prompt: add_bos_token = true)
    <|im_start|>   control
    <|im_end|>     EOS / end of turn

The chat template is Qwen2.5's ChatML with tools (`--jinja` renders `tools`, assistant
`tool_calls` and `tool` results), without a default system prompt.

What it generates is gibberish, but only ever printable ASCII (bytes 0x20-0x7e and merges of
them): every embedding has a constant 1.0 in dimension 0, no layer writes to dimension 0, and
the output head gives that dimension +3 for printable tokens and -3 for every other token
(other bytes, control tokens, EOS). After the final RMS norm that is a margin of about 35
logits, so at any sane temperature nothing else is ever sampled: responses are valid UTF-8
and always run to `max_tokens` (finish_reason "length").
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX_TRAIN = 8192
SEED = 20240611

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Pairs merged into one token, in rank order (byte-level spelling: "Ġ" is the space byte).
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("Ġ", "a"),
    ("r", "e"), ("Ġt", "he"), ("e", "s"), ("o", "r"), ("e", "n"), ("Ġ", "s"), ("a", "r"),
    ("Ġ", "c"), ("Ġ", "d"), ("Ġ", "p"), ("Ġ", "e"), ("Ġ", "l"), ("Ġ", "y"),
]

CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocab() -> tuple[list[str], list[int], list[bool]]:
    """(tokens, token types, printable?) in id order."""
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    printable = [0x20 <= b <= 0x7E for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    for a, b in MERGES:
        tokens.append(a + b)
        types.append(gguf.TokenType.NORMAL)
        printable.append(True)  # merges of printable bytes only
    for special in (BOS, IM_START, IM_END):
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
        printable.append(False)
    return tokens, [int(t) for t in types], printable


def write_model(path) -> str:
    """Writes the model to `path` and returns it (as a string)."""
    path = str(path)
    rng = np.random.default_rng(SEED)
    tokens, types, printable = vocab()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD

    def rand(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("quipu-tiny-test")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(tokens.index(BOS))
    w.add_eos_token_id(tokens.index(IM_END))
    w.add_eot_token_id(tokens.index(IM_END))
    w.add_pad_token_id(tokens.index(BOS))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    # Embeddings: dimension 0 is a constant 1.0, the rest random.
    emb = rand(n_vocab, N_EMBD, scale=0.1)
    emb[:, 0] = 1.0
    w.add_tensor("token_embd.weight", emb)
    for i in range(N_LAYER):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{p}.attn_q.weight", rand(N_HEAD * head_dim, N_EMBD, scale=0.2))
        w.add_tensor(f"{p}.attn_k.weight", rand(N_HEAD_KV * head_dim, N_EMBD, scale=0.2))
        w.add_tensor(f"{p}.attn_v.weight", rand(N_HEAD_KV * head_dim, N_EMBD, scale=0.2))
        out = rand(N_EMBD, N_HEAD * head_dim, scale=0.02)
        out[0, :] = 0.0  # never writes to dimension 0
        w.add_tensor(f"{p}.attn_output.weight", out)
        w.add_tensor(f"{p}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{p}.ffn_gate.weight", rand(N_FF, N_EMBD, scale=0.2))
        w.add_tensor(f"{p}.ffn_up.weight", rand(N_FF, N_EMBD, scale=0.2))
        down = rand(N_EMBD, N_FF, scale=0.02)
        down[0, :] = 0.0
        w.add_tensor(f"{p}.ffn_down.weight", down)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    # Output head: dimension 0 decides printable (+3) against everything else (-3).
    head = rand(n_vocab, N_EMBD, scale=0.3)
    head[:, 0] = np.where(np.array(printable), 3.0, -3.0)
    w.add_tensor("output.weight", head)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.gguf")
    print(write_model(sys.argv[1]))
