"""Loads an FP8 compressed-tensors directory that `mindxtrain quantize` wrote, as transformers does.

    fp8_check.py QUANTIZED_DIR ORIGINAL_DIR IDS_JSON OUT_JSON

Writes OUT_JSON with:
  logits          the model's logits for IDS with the weights compressed-tensors decompressed and the
                  activations left unquantized (what our dequantized weights give);
  logits_dynamic  the same with compressed-tensors' dynamic per-token FP8 activations on (reported);
  modules         per quantized Linear: whether torch's own E4M3 cast of the original weight with the
                  stored scale gives the stored codes, and the largest |decompressed - codes * scale|.
"""

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    qdir, odir, ids_path, out_path = sys.argv[1:5]
    ids = torch.tensor([json.load(open(ids_path))])
    stored = load_file(f"{qdir}/model.safetensors")
    original = load_file(f"{odir}/model.safetensors")

    model = AutoModelForCausalLM.from_pretrained(qdir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        dynamic = model(ids).logits[0]
    from compressed_tensors.quantization import disable_quantization

    model.apply(disable_quantization)
    with torch.no_grad():
        plain = model(ids).logits[0]

    params = dict(model.named_parameters())
    modules = {}
    for name, codes in stored.items():
        if codes.dtype != torch.float8_e4m3fn:
            continue
        scale = stored[name + "_scale"]
        w = original[name].to(torch.float32)
        # compressed-tensors' own quantization of the original weight with our scale.
        ours = codes.view(torch.uint8)
        theirs = torch.clamp(w / scale.to(torch.float32), -448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        decompressed = params[name].detach().to(torch.float32)
        want = codes.to(torch.float32) * scale.to(torch.float32)
        modules[name] = {
            "codes_equal_torch_cast": bool(torch.equal(ours, theirs)),
            "decompressed_max_diff": float((decompressed - want).abs().max()),
            "weight_dtype_in_model": str(params[name].dtype),
        }
    json.dump(
        {"logits": plain.tolist(), "logits_dynamic": dynamic.tolist(), "modules": modules},
        open(out_path, "w"),
    )


if __name__ == "__main__":
    main()
