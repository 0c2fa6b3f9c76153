"""tests/python/test_gpt.py: tessera.nn.GPT, generation and the tokenizers from Python. The model has Hugging
Face's GPT2LMHeadModel names and shapes, its logits come back identical through save_safetensors and
from_safetensors and with gradients; generate (the key/value cache) equals a greedy loop over the full forward,
is reproducible for a seed, and refuses bad arguments with the library's messages; a training checkpoint of a GPT
run loads with from_checkpoint. Against transformers where it is importable: GPT2LMHeadModel with our weights
gives the same logits (1e-5) and gradients, its save_pretrained files load, and its greedy generate gives the same
tokens. The byte tokenizer round-trips any text and bytes; GPT-2's BPE on tests/golden/tok gives tiktoken's ids;
tessera.data.tokenize writes the shards `tessera data tokenize` writes."""
import glob
import os
import struct
import subprocess
import tempfile

import torch

import tessera
from tessera import nn, ops
from tessera.data import Tokenizer, token_shard_info, tokenize
from testutil import check, raises

HERE = os.path.dirname(os.path.abspath(__file__))
GOLD = os.path.join(HERE, "..", "golden", "tok")
TS = os.environ.get("TESSERA_BIN", "")
V = 97


def T(x):
    return torch.from_dlpack(x.detach())


def greedy_full(model, prompt, n):
    """Greedy continuation by full forwards (no cache) over the last seq_len tokens: what generate(temperature=0)
    must give."""
    seq, L = list(prompt), model.config["seq_len"]
    with tessera.no_grad():
        for _ in range(n):
            logits = T(model(torch.tensor([seq[-L:]])))
            seq.append(int(torch.argmax(logits[0, -1])))
    return seq[len(prompt):]


# ---- the model: names, shapes, config, seeds ------------------------------------------------------------------
m = nn.GPT("gpt2-tiny", vocab_size=V, init_std=0.2, seed=3)  # init_std 0.2: logits far apart, greedy unambiguous
sd = m.state_dict()
check(len(sd) == 4 + 12 * 2 and "lm_head.weight" not in sd and list(sd)[0] == "transformer.wte.weight",
      f"state_dict: GPT2LMHeadModel's {len(sd)} names, the tied head once")
check(tuple(sd["transformer.h.1.attn.c_attn.weight"].shape) == (64, 192) and
      tuple(sd["transformer.wpe.weight"].shape) == (64, 64) and tuple(sd["transformer.wte.weight"].shape) == (V, 64),
      "Conv1D weights [in, out], wpe (seq_len, n_embd), wte (vocab, n_embd)")
c = m.config
check((c["n_layer"], c["n_head"], c["n_embd"], c["seq_len"], c["vocab_size"]) == (2, 2, 64, 64, V) and
      c["layer_norm_eps"] == 1e-5 and c["init_std"] == 0.2 and c["dropout"] == 0, f"config: {c}")
same = nn.GPT("gpt2-tiny", vocab_size=V, init_std=0.2, seed=3).state_dict()
check(torch.equal(T(same["transformer.h.0.mlp.c_fc.weight"]), T(sd["transformer.h.0.mlp.c_fc.weight"])) and
      not torch.equal(T(nn.GPT("gpt2-tiny", vocab_size=V, init_std=0.2, seed=4).state_dict()["transformer.wte.weight"]),
                      T(sd["transformer.wte.weight"])), "seed: the same weights for a seed, others for another")
z = nn.zoo("gpt2-tiny", num_classes=V)
check(isinstance(z, nn.GPT) and z.config["vocab_size"] == V, "nn.zoo('gpt2-tiny') is a GPT")
check(repr(m) == "GPT(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab_size=97)", repr(m))
raises(tessera.ArgumentError, "unknown GPT preset 'gpt3'", nn.GPT, "gpt3")
raises(tessera.ArgumentError, "n_embd 64 must be >= 1 and divisible by n_head 3", nn.GPT, "gpt2-tiny", n_head=3)
raises(tessera.ArgumentError, "dropout 1 must be in [0, 1)", nn.GPT, "gpt2-tiny", dropout=1.0)

# ---- forward with autograd, safetensors round trip ---------------------------------------------------------------
torch.manual_seed(0)
x = torch.randint(0, V, (2, 10))
logits = m(x)
check(tuple(logits.shape) == (2, 10, V) and logits.requires_grad, "logits (B, T, V) with a graph")
y = torch.randint(0, V, (20,))
loss = ops.cross_entropy(ops.reshape(logits, [20, V]), y)
loss.backward()
g = dict(m.named_parameters())["transformer.h.0.attn.c_attn.weight"].grad
check(g is not None and float(T(g).abs().sum()) > 0, "backward fills the parameters' gradients")
raises(tessera.ShapeError, "token ids of dtype int64", m, torch.zeros(2, 10))
raises(tessera.ShapeError, "sequence length 65 must be in [1, seq_len 64]", m, torch.zeros(1, 65, dtype=torch.int64))

with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "m.safetensors")
    m.save_safetensors(p)
    m2 = nn.GPT.from_safetensors(p, "gpt2-tiny", vocab_size=V)
    check(torch.equal(T(m2(x)), T(logits)), "save_safetensors -> from_safetensors: identical logits")
    m3 = nn.GPT("gpt2-tiny", vocab_size=V, seed=9)
    m3.load_state_dict(m.state_dict())
    check(torch.equal(T(m3(x)), T(logits)), "load_state_dict(state_dict()): identical logits")
    raises(tessera.ShapeError, "transformer.wte.weight", nn.GPT.from_safetensors, p, "gpt2-tiny")
    raises(tessera.FileError, "no.safetensors", nn.GPT.from_safetensors, os.path.join(d, "no.safetensors"),
           "gpt2-tiny", vocab_size=V)

# ---- generation ------------------------------------------------------------------------------------------------
prompt = [5, 17, 42, 3]
gen = m.generate(prompt, 20, temperature=0)
check(len(gen) == 20 and all(isinstance(t, int) and 0 <= t < V for t in gen), f"generate: 20 new ids {gen[:6]}...")
check(gen == greedy_full(m, prompt, 20), "greedy generate (key/value cache) == a greedy loop of full forwards")
check(m.generate(prompt, 20, top_k=1, seed=5) == gen, "top_k 1 is greedy")
check(m.generate(torch.tensor(prompt), 20, temperature=0) == gen and
      m.generate(torch.tensor([prompt]), 20, temperature=0) == gen and
      m.generate(tessera.tensor(prompt, dtype="int64"), 20, temperature=0) == gen,
      "the prompt as a torch or tessera int64 tensor, (T) or (1, T)")
s1, s2 = m.generate(prompt, 30, temperature=1.0, seed=7), m.generate(prompt, 30, temperature=1.0, seed=7)
check(s1 == s2 and s1 != m.generate(prompt, 30, temperature=1.0, seed=8), "sampling: a seed gives the same tokens")
check(m.training and m.generate(prompt, 0) == [], "max_new_tokens 0: nothing; the training mode is kept")
long = list(range(60))  # past seq_len 64: the model sees the last 64 tokens (nanoGPT's crop)
check(m.generate(long, 10, temperature=0) == greedy_full(m, long, 10), "greedy past seq_len: the cropped context")
raises(tessera.DtypeError, "dtype float32: token ids are int64", m.generate, torch.tensor([1.0, 2.0]), 4)
raises(TypeError, "item 1 is a float", m.generate, [1, 2.5], 4)
raises(tessera.ArgumentError, "max_new_tokens -1 must be >= 0", m.generate, prompt, -1)
raises(tessera.ArgumentError, "an empty prompt", m.generate, [], 4)
raises(tessera.ArgumentError, "prompt token 97 (at 1) is outside [0, vocab_size 97)", m.generate, [1, 97], 4)
raises(tessera.ArgumentError, "temperature -1 must be finite and >= 0", m.generate, prompt, 4, temperature=-1)
raises(tessera.ArgumentError, "top_k -2 must be >= 0", m.generate, prompt, 4, top_k=-2)

# ---- the byte tokenizer ----------------------------------------------------------------------------------------
b = Tokenizer.bytes()
check((b.kind, b.vocab_size, b.eot) == ("bytes", 257, 256), repr(b))
text = "héllo, wörld — 日本語 🙂 ∑"
ids = b.encode(text)
check(ids == list(text.encode("utf-8")) and b.decode(ids) == text, "bytes: ids are the UTF-8 bytes, decode inverts")
check(b.decode(ids[:-1]).endswith(" \ufffd") and b.decode_bytes(ids[:-1]) == text.encode("utf-8")[:-1],
      "a cut multi-byte character: U+FFFD in decode, the bytes themselves in decode_bytes")
raw = b"\xff\xfe\x80abc\xc3"
check(b.decode_bytes(b.encode(raw)) == raw, "bytes that are not UTF-8 round-trip through encode(bytes)/decode_bytes")
check(b.encode("a<|endoftext|>b", special=True) == [97, 256, 98] and len(b.encode("a<|endoftext|>b")) == 15,
      "special=True: <|endoftext|> is the EOT id; False: ordinary text")
check(b.decode(torch.tensor([104, 105])) == "hi", "decode takes an int64 tensor")
raises(tessera.ArgumentError, "id 257 at position 1 is outside the vocabulary of 257", b.decode, [1, 257])
raises(tessera.ArgumentError, "id -1 at position 0 is outside the vocabulary", b.decode, [-1])
raises(TypeError, "expected str or bytes", b.encode, 5)
raises(tessera.ArgumentError, "unknown", Tokenizer, "sentencepiece")

# ---- GPT-2's BPE on the golden vocabulary --------------------------------------------------------------------------
vocab, merges = os.path.join(GOLD, "vocab.json"), os.path.join(GOLD, "merges.txt")
g2 = Tokenizer.gpt2(vocab, merges)
check((g2.kind, g2.vocab_size, g2.eot) == ("gpt2", 1280, 1279), repr(g2))
golden_text = open(os.path.join(GOLD, "text.txt"), "rb").read()
with open(os.path.join(GOLD, "text.ids.bin"), "rb") as f:
    head = struct.unpack("<256i", f.read(1024))
    golden_ids = list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))
check(g2.encode(golden_text.decode("utf-8"), special=True) == golden_ids,
      f"gpt2: tiktoken's {len(golden_ids)} ids for the golden text")
check(g2.decode_bytes(golden_ids) == golden_text and g2.decode(golden_ids) == golden_text.decode("utf-8"),
      "gpt2: decode gives the text back")
info = token_shard_info(os.path.join(GOLD, "text.ids.bin"), vocab_size=1280)
check(info["tokens"] == len(golden_ids) and info["max_id"] == max(golden_ids) and info["entropy_bits"] > 5,
      f"token_shard_info: {info}")
with tempfile.TemporaryDirectory() as d:
    raises(tessera.FileError, "nosuch.json", Tokenizer.gpt2, os.path.join(d, "nosuch.json"), merges)
    bad = os.path.join(d, "bad.json")
    open(bad, "w").write('{"a": 0, ')
    raises(tessera.FormatError, "bad.json", Tokenizer.gpt2, bad, merges)
    short = os.path.join(d, "short.bin")
    open(short, "wb").write(b"\0" * 10)
    raises(tessera.FormatError, "short.bin", token_shard_info, short)

# ---- tokenize: shards as `tessera data tokenize` writes them; a GPT trained on them, from its checkpoint ----------
with tempfile.TemporaryDirectory() as d:
    src = os.path.join(GOLD, "text.txt")
    r = tokenize(src, os.path.join(d, "py"), tokenizer=g2, val_fraction=0.1, shard_tokens=10000, special=True)
    n = len(golden_ids) + 1
    check(r["tokens"] == n and r["val_tokens"] == n // 10 and r["train_tokens"] == n - n // 10 and
          r["vocab_size"] == 1280 and r["bytes"] == len(golden_text), f"tokenize: {r['tokens']} tokens, the splits")
    shards = sorted(glob.glob(os.path.join(d, "py", "*.bin")))
    check(len(shards) == r["val_shards"] + r["train_shards"] == 1 + 3 and
          sum(token_shard_info(s)["tokens"] for s in shards) == n, f"{len(shards)} shards of at most 10000 tokens")
    if TS and os.path.exists(TS):
        subprocess.run([TS, "data", "tokenize", src, "--out", os.path.join(d, "cli"), "--tokenizer", "gpt2", "--vocab",
                        vocab, "--merges", merges, "--shard-tokens", "10000", "--special"], check=True,
                       stdout=subprocess.DEVNULL)
        same = all(open(s, "rb").read() == open(os.path.join(d, "cli", os.path.basename(s)), "rb").read()
                   for s in shards)
        check(same and len(glob.glob(os.path.join(d, "cli", "*.bin"))) == len(shards),
              "tokenize writes the command's shards, byte for byte")
    raises(tessera.FileError, "nosuch.txt", tokenize, [os.path.join(d, "nosuch.txt")], os.path.join(d, "x"))
    raises(TypeError, "expected a Tokenizer", tokenize, src, os.path.join(d, "x"), tokenizer=3)

    rb = tokenize([src], os.path.join(d, "bytes"))
    check(rb["vocab_size"] == 257 and rb["tokens"] == len(golden_text) + 1, "tokenize with the byte tokenizer")
    ck = os.path.join(d, "gpt.ckpt")
    tessera.train(model="gpt2-tiny", data=os.path.join(d, "bytes"), seq_len=16, batch_size=2, max_steps=2,
                  optimizer="adamw", lr=1e-3, threads=1, checkpoint=ck, progress=False)
    mc = nn.GPT.from_checkpoint(ck)
    saved = tessera.load_checkpoint(ck)
    check(mc.config["vocab_size"] == 257 and mc.config["n_layer"] == 2 and set(mc.state_dict()) == set(saved) and
          all(torch.equal(T(v), T(saved[k])) for k, v in mc.state_dict().items()),
          f"from_checkpoint: the trained GPT's weights and sizes ({mc})")
    check(len(mc.generate(b.encode("In the beginning"), 8, temperature=0)) == 8, "generate from the checkpoint's GPT")
    raises(tessera.FileError, "nosuch.ckpt", nn.GPT.from_checkpoint, os.path.join(d, "nosuch.ckpt"))
    # a GPT object as the run's model: trained in place on the shards at its own context, its checkpoint a GPT's
    mo = nn.GPT("gpt2-tiny", seq_len=16, vocab_size=257, seed=5)
    before = {k: T(v).clone() for k, v in mo.state_dict().items()}
    ck3 = os.path.join(d, "obj.ckpt")
    r3 = tessera.train(model=mo, data=os.path.join(d, "bytes"), batch_size=2, max_steps=3, optimizer="adamw",
                       lr=1e-3, threads=1, checkpoint=ck3, progress=False)
    after = mo.state_dict()
    check(r3["tokens"] == 3 * 2 * 16 and all(not torch.equal(before[k], T(v)) for k, v in after.items()),
          f"a GPT object trains in place on token shards ({r3['tokens']} tokens, every tensor moved)")
    m3 = nn.GPT.from_checkpoint(ck3)
    check(m3.config["seq_len"] == 16 and all(torch.equal(T(v), T(after[k])) for k, v in m3.state_dict().items()),
          "its checkpoint loads as a GPT with the object's weights")
    raises(tessera.ArgumentError, "vocab_size 200", tessera.train, model=nn.GPT("gpt2-tiny", seq_len=16,
           vocab_size=200), data=os.path.join(d, "bytes"), max_steps=1, progress=False)
    if os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):  # the run's default data
        ck2 = os.path.join(d, "mlp.ckpt")
        tessera.train(model="mlp", max_steps=1, epochs=1, batch_size=8, threads=1, checkpoint=ck2, progress=False)
        raises(tessera.ArgumentError, "mlp.ckpt holds a mlp, not a GPT", nn.GPT.from_checkpoint, ck2)
    else:
        print("skip: no Fashion-MNIST: from_checkpoint of another model's checkpoint")

# ---- against transformers ---------------------------------------------------------------------------------------
try:
    import transformers
except ImportError:
    transformers = None
if transformers is None:
    print("skip: no transformers: the comparison with GPT2LMHeadModel (.pyvenv-torch has it)")
else:
    transformers.utils.logging.disable_progress_bar()
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=V, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=None,
                                  eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    missing, unexpected = hf.load_state_dict({k: T(v).clone() for k, v in m.state_dict().items()}, strict=False)
    check(set(missing) <= {"lm_head.weight"} and not unexpected, f"GPT2LMHeadModel takes our state dict ({missing})")
    check(hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr(), "its head stays tied to wte")
    m.zero_grad()
    lg = m(x)
    ops.cross_entropy(ops.reshape(lg, [20, V]), y).backward()
    hl = hf(x).logits
    torch.nn.functional.cross_entropy(hl.reshape(20, V), y).backward()
    diff = float((T(lg) - hl.detach()).abs().max())
    check(diff < 1e-5, f"logits equal GPT2LMHeadModel's: max |diff| {diff:.2e}")
    gd = max(float((T(p.grad) - dict(hf.named_parameters())[k].grad).abs().max())
             for k, p in m.named_parameters())
    check(gd < 1e-5, f"gradients equal GPT2LMHeadModel's: max |diff| {gd:.2e}")
    tok = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(tok, attention_mask=torch.ones_like(tok), max_new_tokens=40, do_sample=False,
                          pad_token_id=0)
    hgen = out[0, len(prompt):].tolist()
    mine = m.generate(prompt, 40, temperature=0)
    check(mine == hgen, f"greedy generate == transformers' generate(do_sample=False): {mine[:8]}...")
    with tempfile.TemporaryDirectory() as d:
        hf2 = transformers.GPT2LMHeadModel(cfg).eval()
        hf2.save_pretrained(d)
        m4 = nn.GPT.from_safetensors(os.path.join(d, "model.safetensors"), config=os.path.join(d, "config.json"))
        with torch.no_grad():
            diff = float((T(m4(x)) - hf2(x).logits).abs().max())
        check(m4.config["vocab_size"] == V and diff < 1e-5, f"save_pretrained's files: logits {diff:.2e} apart")
        m5 = nn.GPT("gpt2-tiny", vocab_size=V)
        m5.load_state_dict(hf2.state_dict())  # lm_head.weight included
        check(torch.equal(T(m5(x)), T(m4(x))), "load_state_dict(GPT2LMHeadModel.state_dict()) as it is")
        m.save_safetensors(os.path.join(d, "model.safetensors"))
        hf3 = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
        with torch.no_grad():
            diff = float((hf3(x).logits - T(m(x))).abs().max())
        check(diff < 1e-5, f"from_pretrained reads save_safetensors's file: logits {diff:.2e} apart")
print("all passed")
