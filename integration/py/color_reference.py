"""torchvision's colour operations on real photos, for tests/it/color.rs (run by that test).

    python color_reference.py OUT

Writes into OUT, for scikit-image's astronaut, coffee and chelsea photos (resized to 160x120 with
PIL, as RGB8): `photo-N.rgb` (the input, raw HWC bytes) and, for each operation and factor in
CASES, `photo-N-OP-FACTOR.rgb`: torchvision.transforms.v2.functional's `adjust_brightness`,
`adjust_contrast`, `adjust_saturation`, `adjust_hue`, `rgb_to_grayscale(num_output_channels=3)` or `gaussian_blur(k, sigma)`
(factor `[k, sigma]`)
on the uint8 CHW tensor, back to HWC bytes. Prints a JSON manifest:
{"width": 160, "height": 120, "cases": [{"photo": "photo-0.rgb", "op": "hue", "factor": 0.1,
"out": "photo-0-hue-0.1.rgb"}, ...]}.
"""
import json
import os
import sys

import numpy as np
import skimage.data
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

W, H = 160, 120
CASES = [("brightness", f) for f in (0.0, 0.6, 1.3, 2.0)] + \
    [("contrast", f) for f in (0.0, 0.5, 1.4, 2.5)] + \
    [("saturation", f) for f in (0.0, 0.3, 1.6, 3.0)] + \
    [("hue", f) for f in (-0.5, -0.25, -0.07, 0.0, 0.1, 0.33, 0.5)] + \
    [("grayscale", 0.0)] + \
    [("blur", (k, sg)) for k, sg in ((3, 0.5), (5, 1.0), (9, 2.0), (23, 4.0))]


def apply(t, op, f):
    if op == "brightness":
        return F.adjust_brightness(t, f)
    if op == "contrast":
        return F.adjust_contrast(t, f)
    if op == "saturation":
        return F.adjust_saturation(t, f)
    if op == "hue":
        return F.adjust_hue(t, f)
    if op == "blur":
        k, sg = f
        return F.gaussian_blur(t, [k, k], [sg, sg])
    return F.rgb_to_grayscale(t, num_output_channels=3)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = []
    for i, name in enumerate(["astronaut", "coffee", "chelsea"]):
        img = Image.fromarray(getattr(skimage.data, name)()).convert("RGB").resize((W, H), Image.BILINEAR)
        rgb = np.asarray(img, dtype=np.uint8)
        photo = f"photo-{i}.rgb"
        rgb.tofile(os.path.join(out, photo))
        t = torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()
        for op, f in CASES:
            got = apply(t, op, f).permute(1, 2, 0).contiguous().numpy()
            assert got.dtype == np.uint8 and got.shape == (H, W, 3)
            name_out = f"photo-{i}-{op}-{f}.rgb".replace(" ", "").replace("(", "").replace(")", "").replace(",", "_")
            got.tofile(os.path.join(out, name_out))
            cases.append({"photo": photo, "op": op, "factor": f, "out": name_out})
    print(json.dumps({"width": W, "height": H, "cases": cases}))


if __name__ == "__main__":
    main()
