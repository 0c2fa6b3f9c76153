"""tests/python/test_train.py: tessera.train — the command's run from Python. The same flags give the same
parameters, bit for bit, as `tessera train` ($TESSERA_BIN); events reach the callback (steps, epoch end with the
evaluation, checkpoint), also for two DDP ranks under `tessera run -n 2 python`; bad fields and values are tessera.ArgumentError naming the field; an exception in the
callback and Ctrl-C stop the run and come back as themselves; nproc > 1 outside a launcher says how to start
the ranks. The exports: safetensors from a checkpoint and from a dict of torch tensors (read back by the
`safetensors` package where installed), ONNX from a checkpoint. A GPT on token shards: tokens counted, eval
events every eval_every steps."""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch

import tessera
from testutil import check, raises

FMNIST = "/usr/share/datasets/fashion-mnist"
TS = os.environ.get("TESSERA_BIN", "")


if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
    print(f"skip: no Fashion-MNIST in {FMNIST} (scripts/install-deps)")
    sys.exit(0)

fields = {f["name"]: f for f in tessera.run_fields()}
check({"model", "image_size", "precision", "sync_bn", "pp_schedule"} <= set(fields), "run_fields names the config")
check(fields["precision"]["choices"] == ["fp32", "bf16", "fp16"] and fields["epochs"]["default"] == 4 and
      fields["image_size"]["flag"] == "image-size", "kinds, defaults, choices and flags")

raises(tessera.ArgumentError, "unknown field 'imagesize'", tessera.train, imagesize=64, progress=False)
raises(tessera.ArgumentError, "epochs 0: expected a value in [1, 1e+06]", tessera.train, epochs=0)
raises(tessera.ArgumentError, "precision: unknown value 'fp8' (expected fp32, bf16 or fp16)", tessera.train,
       precision="fp8")
raises(tessera.ArgumentError, "batch_size: expected an integer, got '1.5'", tessera.train, batch_size=1.5)
raises(TypeError, "max_steps: expected a number, a bool, a string or a path, not list", tessera.train, max_steps=[1])
raises(tessera.FileError, "data /no/such/folder", tessera.train, data="/no/such/folder")
raises(tessera.ArgumentError, "start 2 of them with `tessera run -n 2", tessera.train, nproc=2)

with tempfile.TemporaryDirectory() as d:
    common = {"max_steps": 12, "epochs": 1, "batch_size": 32, "threads": 1, "seed": 7, "lr": 0.02}
    events = []
    ck = os.path.join(d, "py.ckpt")
    r = tessera.train(common, checkpoint=ck, callback=events.append, progress=False)
    kinds = [e["kind"] for e in events]
    check(kinds == ["step"] * 12 + ["epoch_end", "checkpoint"], f"events: 12 steps, epoch end, checkpoint ({kinds[-3:]})")
    check([e["step"] for e in events[:12]] == list(range(1, 13)), "steps counted from 1")
    check(events[12]["eval"]["samples"] == 10000 and 0 < events[12]["eval"]["accuracy"] <= 1, "epoch end: the evaluation")
    check(events[13]["checkpoint"] == ck and os.path.exists(ck), "checkpoint event names the file")
    check(r["steps"] == 12 and r["images"] == 12 * 32 and r["model"] == "cnn" and r["world_size"] == 1 and
          abs(r["final_loss"] - events[11]["loss"]) < 1e-12, f"result: {r['steps']} steps, {r['images']} images")

    if TS:
        ck2 = os.path.join(d, "cli.ckpt")
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in common.items()]
        p = subprocess.run([TS, "train", "--quiet", "--checkpoint", ck2] + flags, capture_output=True, text=True)
        check(p.returncode == 0, f"tessera train ran ({p.stderr[-200:]})")
        a, b = tessera.load_checkpoint(ck), tessera.load_checkpoint(ck2)
        same = sorted(a) == sorted(b) and all(torch.equal(torch.from_dlpack(a[k]), torch.from_dlpack(b[k])) for k in a)
        check(same, f"tessera.train and `tessera train` with the same fields: the same {len(a)} tensors, bit for bit")

        # two DDP ranks: the script under `tessera run -n 2` trains what `tessera train --nproc 2` trains
        ck3, ck4 = os.path.join(d, "py2.ckpt"), os.path.join(d, "cli2.ckpt")
        script = ("import sys, tessera; r = tessera.train(dict(max_steps=6, epochs=1, batch_size=16, seed=3, lr=0.02), "
                  "checkpoint=sys.argv[1], progress=False); assert r['world_size'] == 2, r")
        p = subprocess.run([TS, "run", "-n", "2", "--", sys.executable, "-c", script, ck3], capture_output=True, text=True)
        check(p.returncode == 0, f"tessera run -n 2 python: two ranks trained ({p.stderr[-300:]})")
        p = subprocess.run([TS, "train", "--quiet", "--nproc", "2", "--max-steps", "6", "--epochs", "1", "--batch-size",
                            "16", "--seed", "3", "--lr", "0.02", "--checkpoint", ck4], capture_output=True, text=True)
        check(p.returncode == 0, f"tessera train --nproc 2 ran ({p.stderr[-200:]})")
        a, b = tessera.load_checkpoint(ck3), tessera.load_checkpoint(ck4)
        check(all(torch.equal(torch.from_dlpack(a[k]), torch.from_dlpack(b[k])) for k in a) and sorted(a) == sorted(b),
              "DDP from Python under tessera run: the same parameters as tessera train --nproc 2, bit for bit")

    # an exception in the callback stops the run at that event and comes back as itself
    class Stop(Exception):
        pass

    seen = []

    def stop_at_5(ev):
        seen.append(ev["step"])
        if ev["step"] == 5:
            raise Stop("enough")

    raises(Stop, "enough", tessera.train, common, callback=stop_at_5, progress=False)
    check(seen == [1, 2, 3, 4, 5], f"the run stopped at the raising event ({seen})")

    # Ctrl-C during a long run (no callback): KeyboardInterrupt at the next step, promptly
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        tessera.train(common, max_steps=100000, epochs=100, progress=False)
        check(False, "Ctrl-C stopped the run")
    except KeyboardInterrupt:
        check(time.monotonic() - t0 < 20, f"Ctrl-C: KeyboardInterrupt after {time.monotonic() - t0:.1f} s")

    # exports
    st = os.path.join(d, "m.safetensors")
    n = tessera.export_safetensors(ck, st)
    sd = tessera.load_checkpoint(ck)
    check(n == len(sd), f"export_safetensors: {n} tensors")
    x = {"w": torch.arange(12.0).reshape(3, 4).t(), "i": torch.arange(5), "h": torch.ones(2, dtype=torch.bfloat16)}
    mine = os.path.join(d, "mine.safetensors")
    tessera.save_safetensors(x, mine, metadata={"format": "pt"})
    try:
        import safetensors.torch as stt
    except ImportError:
        stt = None
    if stt:
        back = stt.load_file(mine)
        check(all(torch.equal(back[k], x[k]) for k in x) and back["w"].is_contiguous(),
              "save_safetensors: a transposed view, int64, bfloat16 read back by the safetensors package")
        exported = stt.load_file(st)
        check(all(torch.equal(exported[k], torch.from_dlpack(sd[k])) for k in sd),
              "export_safetensors: the checkpoint's tensors, read by the safetensors package")
    raises(tessera.ArgumentError, "name", tessera.save_safetensors, {"": torch.zeros(1)}, mine)
    raises(TypeError, "__dlpack__", tessera.save_safetensors, {"a": [1, 2]}, mine)
    onnx_path = os.path.join(d, "m.onnx")
    check(tessera.export_onnx(onnx_path, checkpoint=ck) == "cnn" and os.path.getsize(onnx_path) > 1000,
          "export_onnx: the checkpoint's cnn")
    check(tessera.export_onnx(onnx_path, model="mlp", input_shape=[2, 1, 28, 28], dynamic_batch=False) == "mlp",
          "export_onnx: a fresh zoo model, a fixed input shape")
    raises(tessera.ArgumentError, "unknown model 'nosuch'", tessera.export_onnx, onnx_path, model="nosuch")
    raises(tessera.ArgumentError, "a model name or a checkpoint", tessera.export_onnx, onnx_path)
# a GPT on token shards (made by `tessera data tokenize`): tokens counted, eval events, validation loss
if TS:
    with tempfile.TemporaryDirectory() as d:
        here = os.path.dirname(os.path.abspath(__file__))
        text = os.path.join(here, "..", "golden", "tok", "text.txt")
        subprocess.run([TS, "data", "tokenize", text, "--out", os.path.join(d, "tok")], check=True,
                       stdout=subprocess.DEVNULL)
        events = []
        r = tessera.train(model="gpt2-tiny", data=os.path.join(d, "tok"), seq_len=16, batch_size=4, max_steps=6,
                          eval_every=3, eval_batches=2, optimizer="adamw", lr=3e-3, threads=1,
                          callback=events.append, progress=False)
        check(r["model"] == "gpt2-tiny" and r["num_classes"] == 257 and r["tokens"] == 6 * 4 * 16 and
              r["tokens_per_second"] > 0, f"a GPT's run: 257 tokens, {r['tokens']} trained")
        evals = [e for e in events if e["kind"] == "eval"]
        check([e["step"] for e in evals] == [3, 6] and evals[-1]["eval"]["samples"] == 2 * 4 * 16 and
              evals[-1]["tokens_per_second"] > 0, "eval events every 3 steps, over 2 batches of positions")
        r2 = tessera.train(model="gpt2-tiny", data=os.path.join(d, "tok"), seq_len=16, batch_size=4, max_steps=6,
                           optimizer="adamw", lr=3e-3, threads=1, activation_checkpointing=True, progress=False)
        check(r2["final_loss"] == r["final_loss"],
              f"activation_checkpointing=True: the same final loss ({r2['final_loss']:.6f}), bit for bit")
        raises(tessera.ArgumentError, "holds token shards: model cnn takes images", tessera.train, model="cnn",
               data=os.path.join(d, "tok"), max_steps=1, progress=False)
print("all passed")
