#!/usr/bin/env python3
"""
scripts/gen_gpt_golden.py — Hugging Face's transformers.GPT2LMHeadModel as the reference for tests/test_gpt.c
(src/nn/gpt.c, src/nn/gpt_generate.c): a randomly initialised tiny GPT-2 (built from a GPT2Config, nothing
downloaded), its weights as save_pretrained(safe_serialization=True) writes them, its logits, loss and every
gradient on two batches, 20 torch.optim.AdamW steps with nanoGPT's weight-decay groups, and greedy generation.

Regenerate with the newest torch and transformers from pip (the test needs neither):

    .pyvenv-torch/bin/python scripts/gen_gpt_golden.py

Deterministic for a torch version (torch.manual_seed(1234)); "torch_version" and "transformers_version"
record which wrote it. Float32, one thread, dropout 0.

Outputs:
  tests/golden/gpt_tiny.safetensors   the model as GPT2LMHeadModel.save_pretrained writes it (its
                                      model.safetensors: every parameter, no lm_head.weight)
  tests/golden/gpt_tiny_trained.safetensors   the same after the 20 AdamW steps below
  tests/golden/gpt_greedy.txt         two lines, "prompt <ids>" and "greedy <ids>" (comma-separated): the
                                      greedy case below, for tests/cli_generate.sh
  tests/golden/gpt.tsg.gz             the TSGOLD1 format of scripts/gen_golden.py (tests/golden_io.h):
  "torch_version", "transformers_version"   i32: the version's characters
  "config"            i64 (5): n_layer, n_head, n_embd, n_positions (seq_len), vocab_size (layer_norm_epsilon
                      1e-5, activation gelu_new, tied embeddings)
  "<case>/ids"        i64 (B, T): input ids; case "full" B 2, T 80 (= seq_len: two of the attention kernel's
                      64-query tiles, the second partial), case "short" B 2, T 37 (< seq_len)
  "<case>/targets"    i64 (B, T): the next id (the last one drawn), so the training below learns the batch
  "<case>/logits"     f32 (B, T, V)
  "<case>/loss"       f32 (1): F.cross_entropy(logits.view(-1, V), targets.view(-1))
  "<case>/grad/<name>"  f32: d loss / d parameter, Hugging Face's names (the tied head's gradient is in
                      transformer.wte.weight's)
  "adamw/hparams"     f32 (5): lr, beta1, beta2, eps, weight_decay
  "adamw/loss"        f32 (20): the loss before each of the 20 steps, all on the "full" batch
                      (the parameters after them: gpt_tiny_trained.safetensors). Groups as nanoGPT's
                      configure_optimizers: parameters with dim >= 2 (the Conv1D weights, wte, wpe) decay,
                      the others (biases, LayerNorms) have weight_decay 0
  "gen/prompt"        i64 (7): a prompt: the first 7 ids of the "full" batch's first row
  "gen/greedy"        i64 (24): the trained model's generate(prompt, do_sample=False, max_new_tokens=24,
                      min_new_tokens=24): the new tokens only
"""
import gzip
import os
import struct
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "gpt.tsg.gz")
OUT_ST = os.path.join(ROOT, "tests", "golden", "gpt_tiny.safetensors")
OUT_TRAINED = os.path.join(ROOT, "tests", "golden", "gpt_tiny_trained.safetensors")
MAGIC = b"TSGOLD1\n"
CODES = {torch.float32: (0, "f"), torch.int64: (3, "q"), torch.int32: (4, "i")}
N_LAYER, N_HEAD, N_EMBD, SEQ, VOCAB = 2, 4, 48, 80, 320


def write(path, records):
    out = bytearray(MAGIC + struct.pack("<I", len(records)))
    for name, t in records:
        t = t.detach().contiguous()
        code, fmt = CODES[t.dtype]
        nb = name.encode()
        out += struct.pack("<I", len(nb)) + nb + struct.pack("<BI", code, t.dim())
        out += struct.pack("<%dq" % t.dim(), *t.shape)
        out += struct.pack("<%d%s" % (t.numel(), fmt), *t.flatten().tolist())
    out = gzip.compress(bytes(out), compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        f.write(out)
    print("%s: %d records, %d bytes" % (os.path.relpath(path, ROOT), len(records), len(out)))


def save_safetensors(model, path):
    """model.safetensors as save_pretrained(safe_serialization=True) writes it, moved to path."""
    tmp = os.path.join(ROOT, "tests", "golden", ".gpt_tiny_tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    os.replace(os.path.join(tmp, "model.safetensors"), path)
    os.chmod(path, 0o644)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)


def chars(s):
    return torch.tensor([ord(c) for c in s], dtype=torch.int32)


def loss_of(model, ids, targets):
    logits = model(input_ids=ids).logits
    return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main():
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    cfg = GPT2Config(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, n_positions=SEQ, vocab_size=VOCAB,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
                     eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(cfg).float()
    model.eval()  # dropout is 0 anyway; eval keeps generate() and the forward alike
    save_safetensors(model, OUT_ST)
    names = [n for n, _ in model.named_parameters()]
    rec = [("torch_version", chars(torch.__version__)), ("transformers_version", chars(transformers.__version__)),
           ("config", torch.tensor([N_LAYER, N_HEAD, N_EMBD, SEQ, VOCAB], dtype=torch.int64))]
    g = torch.Generator().manual_seed(99)
    batches = {}
    for case, (B, T) in (("full", (2, SEQ)), ("short", (2, 37))):
        ids = torch.randint(0, VOCAB, (B, T), generator=g)
        targets = torch.cat([ids[:, 1:], torch.randint(0, VOCAB, (B, 1), generator=g)], 1)  # the next token
        batches[case] = (ids, targets)
        model.zero_grad(set_to_none=True)
        logits, loss = loss_of(model, ids, targets)
        loss.backward()
        rec += [(case + "/ids", ids), (case + "/targets", targets), (case + "/logits", logits),
                (case + "/loss", loss.reshape(1))]
        rec += [("%s/grad/%s" % (case, n), p.grad) for n, p in model.named_parameters()]
    # 20 AdamW steps with nanoGPT's groups
    lr, b1, b2, eps, wd = 3e-3, 0.9, 0.95, 1e-8, 0.1
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=eps, foreach=False, fused=False)
    ids, targets = batches["full"]
    losses = []
    model.train()
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        _, loss = loss_of(model, ids, targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    rec += [("adamw/hparams", torch.tensor([lr, b1, b2, eps, wd], dtype=torch.float32)),
            ("adamw/loss", torch.tensor(losses, dtype=torch.float32))]
    save_safetensors(model, OUT_TRAINED)
    # greedy generation from the trained model (the initial one repeats one token)
    model.eval()
    prompt = batches["full"][0][:1, :7].clone()
    with torch.no_grad():
        gen = model.generate(prompt, do_sample=False, max_new_tokens=24, min_new_tokens=24,
                             attention_mask=torch.ones_like(prompt))
    assert gen.shape[1] == 7 + 24, gen.shape
    rec += [("gen/prompt", prompt.reshape(-1)), ("gen/greedy", gen[0, 7:].clone())]
    with open(os.path.join(ROOT, "tests", "golden", "gpt_greedy.txt"), "w") as f:
        f.write("prompt %s\ngreedy %s\n" % (",".join(str(int(v)) for v in prompt.reshape(-1)),
                                            ",".join(str(int(v)) for v in gen[0, 7:])))
    assert len(names) == len(set(names))
    write(OUT, rec)
    print("torch", torch.__version__, "transformers", transformers.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
