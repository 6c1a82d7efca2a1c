"""Write the sweep's case list: python cases.py cases.json

transformers: every model type with a base model (AutoModel) and a causal-LM, masked-LM,
seq2seq-LM or image-classification head. timm: one model of each module (the first by
name size word, else the one with the fewest parameters, counted on the meta device).
torchvision: its classification models.
"""

import json
import sys

import tvshim  # noqa: F401  (before torchvision / transformers)
from models import count_meta

SIZE_WORDS = ["atto", "femto", "pico", "nano", "micro", "xxs", "xs", "tiny", "small"]


def hf_cases():
    from transformers.models.auto import modeling_auto as ma

    heads = set()
    for m in (
        ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    ):
        heads |= set(m)
    return [{"suite": "transformers", "name": t} for t in sorted(set(ma.MODEL_MAPPING_NAMES) & heads)]


def timm_pick(names):
    tests = sorted(n for n in names if n.startswith("test_"))
    if tests:
        return tests[0]
    for w in SIZE_WORDS:
        hit = sorted(n for n in names if w in n.split("_"))
        if hit:
            return hit[0]
    import timm

    counted = [(count_meta(lambda n=n: timm.create_model(n, pretrained=False, num_classes=10)), n) for n in names]
    counted = [c for c in counted if c[0] is not None] or [(0, sorted(names)[0])]
    return min(counted)[1]


def timm_cases():
    import timm

    out = []
    for mod in sorted(timm.list_modules()):
        names = timm.list_models(module=mod)
        if names:
            out.append({"suite": "timm", "name": timm_pick(names), "module": mod})
    return out


def tv_cases():
    import torchvision.models as tvm

    return [{"suite": "torchvision", "name": n} for n in sorted(tvm.list_models(module=tvm))]


if __name__ == "__main__":
    cases = hf_cases() + timm_cases() + tv_cases()
    with open(sys.argv[1], "w") as f:
        json.dump(cases, f, indent=0)
    from collections import Counter

    print(len(cases), Counter(c["suite"] for c in cases))
