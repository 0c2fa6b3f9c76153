#!/usr/bin/env python3
"""
tests/gpt_transformers_check.py DIR — run by tests/test_gpt_transformers.c: DIR holds a GPT that Tessera built
and saved (model.safetensors from ts_gpt_save_safetensors), its sizes (sizes.txt: n_layer n_head n_embd seq_len
vocab_size) and Tessera's logits on a batch (io.safetensors: "ids" int64 (B, T), "logits" float32 (B, T, V)).
Writes a GPT2Config beside the weights and loads them the way users do, GPT2LMHeadModel.from_pretrained(DIR):
no key may be missing, unexpected or mismatched, and transformers' logits on the ids must equal Tessera's within
1e-5. Prints the largest difference; exit status 0 when equal, 1 when not.
"""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    d = sys.argv[1]
    n_layer, n_head, n_embd, seq_len, vocab = (int(v) for v in open(os.path.join(d, "sizes.txt")).read().split())
    GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=seq_len, vocab_size=vocab,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0).save_pretrained(d)
    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print("transformers could not load every tensor: %s" % bad)
        return 1
    io = load_file(os.path.join(d, "io.safetensors"))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=io["ids"]).logits
    err = (logits - io["logits"]).abs().max().item()
    print("transformers %s loaded Tessera's GPT: logits max |diff| %.3g" % (
        __import__("transformers").__version__, err))
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
