"""examples/python/train.py — `tessera train` from Python: the reference CNN on Fashion-MNIST, a callback that
prints the loss every 100 steps, the model exported for PyTorch (safetensors) and for inference runtimes (ONNX).

    PYTHONPATH=build/python python3 examples/python/train.py            # one process
    build/tessera run -n 2 python3 examples/python/train.py             # two DDP ranks (32 images each)
"""
import os

import tessera

world = int(os.environ.get("WORLD_SIZE", "1"))


def every_100_steps(ev):
    if ev["kind"] == "step" and ev["rank"] == 0 and ev["step"] % 100 == 0:
        print(f"step {ev['step']}: loss {ev['mean_loss']:.4f}, {ev['images_per_second']:.0f} images/s", flush=True)


result = tessera.train(model="cnn", epochs=1, batch_size=64 // world, checkpoint="example.ckpt",
                       callback=every_100_steps)
if result["rank"] == 0:
    print(f"test accuracy {100 * result['eval']['accuracy']:.2f}% after {result['steps']} steps")
    n = tessera.export_safetensors("example.ckpt", "example.safetensors")
    tessera.export_onnx("example.onnx", checkpoint="example.ckpt")
    print(f"wrote example.safetensors ({n} tensors) and example.onnx")
