"""Fixtures and PIL reference pixels for decode_images.rs (run by that test, not by pytest).

    python decode_images.py make OUT        write image variants of scikit-image's real photos
                                            into OUT, with PIL's reference pixels, and print a
                                            JSON manifest
    python decode_images.py crops JOBS      JOBS is a JSON list of {file, box, flip, out}: write
                                            PIL's crop(box).resize((224, 224), BILINEAR) there
    python decode_images.py resize JOBS     JOBS is a JSON list of {src, width, height, crop, box,
                                            size, out}: the raw RGB image `src`, cropped to `crop`
                                            (a whole-pixel box, or null) then resized to `size`
                                            with resize(size, BILINEAR, box=box), written raw

References are what torchvision's PIL backend computes: Image.open(f).convert("RGB"), then
Resize(256) as img.resize((new_w, new_h), BILINEAR) and CenterCrop(224).
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image


def data_dir():
    # Imported here so `resize` runs without scikit-image.
    import skimage

    return os.path.join(os.path.dirname(skimage.__file__), "data")


def photo(name):
    return Image.open(os.path.join(data_dir(), name)).convert("RGB")


def png16(path, arr):
    """A 16-bit RGB PNG (PIL cannot write one)."""
    h, w, _ = arr.shape
    raw = b"".join(b"\0" + arr[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw)))
        f.write(chunk(b"IEND", b""))


def variants(out):
    chelsea, coffee, astro = photo("chelsea.png"), photo("coffee.png"), photo("astronaut.png")
    rocket = Image.open(os.path.join(data_dir(), "rocket.jpg"))
    gray = photo("camera.png").convert("L")
    alpha = Image.linear_gradient("L").resize(astro.size)
    v = {}

    def save(name, im, fmt, **kw):
        path = os.path.join(out, name)
        im.save(path, fmt, **kw)
        v[name] = path

    save("c444.jpg", chelsea, "JPEG", quality=90, subsampling=0)
    save("c422.jpg", chelsea, "JPEG", quality=90, subsampling=1)
    save("c420.jpg", coffee, "JPEG", quality=90, subsampling=2)
    save("prog.jpg", coffee, "JPEG", quality=85, progressive=True)
    save("gray.jpg", gray, "JPEG", quality=90)
    save("cmyk.jpg", chelsea.convert("CMYK"), "JPEG", quality=95)
    v["rocket.jpg"] = os.path.join(data_dir(), "rocket.jpg")
    assert rocket.format == "JPEG"
    save("rgb8.png", astro, "PNG")
    a = np.asarray(coffee).astype(np.uint16)
    png16(os.path.join(out, "rgb16.png"), a * 257 + np.arange(a.shape[1], dtype=np.uint16)[None, :, None] % 200)
    v["rgb16.png"] = os.path.join(out, "rgb16.png")
    g16 = (np.asarray(gray).astype(np.uint16) * 3).astype(np.uint16)  # some above 255: PIL clips
    save("gray16.png", Image.fromarray(g16), "PNG")
    save("gray.png", gray, "PNG")
    save("graya.png", Image.merge("LA", (gray, alpha.resize(gray.size))), "PNG")
    save("palette.png", chelsea.convert("P", palette=Image.Palette.ADAPTIVE, colors=200), "PNG")
    save("rgba.png", Image.merge("RGBA", (*astro.split(), alpha)), "PNG")
    save("lossy.webp", coffee, "WEBP", quality=90)
    save("lossless.webp", chelsea, "WEBP", lossless=True)
    save("alpha_lossless.webp", Image.merge("RGBA", (*astro.split(), alpha)), "WEBP", lossless=True)
    save("alpha_lossy.webp", Image.merge("RGBA", (*astro.split(), alpha)), "WEBP", quality=90)
    # Not decoded: named in the error.
    save("chelsea.gif", chelsea, "GIF")
    save("chelsea.bmp", chelsea, "BMP")
    return v


def center(img, size=224, resize=256):
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def make(out):
    manifest = []
    for name, path in variants(out).items():
        entry = {"name": name, "path": path}
        if not name.endswith((".gif", ".bmp")):
            with Image.open(path) as im:
                entry["mode"] = im.mode
                rgb = im.convert("RGB")
            entry["width"], entry["height"] = rgb.size
            with open(path + ".full.rgb", "wb") as f:
                f.write(rgb.tobytes())
            with open(path + ".center.rgb", "wb") as f:
                f.write(center(rgb).tobytes())
        manifest.append(entry)
    json.dump(manifest, sys.stdout)


def crops(jobs_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    for j in jobs:
        img = Image.open(j["file"]).convert("RGB")
        out = img.crop(tuple(j["box"])).resize((224, 224), Image.BILINEAR)
        if j["flip"]:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        with open(j["out"], "wb") as f:
            f.write(out.tobytes())


def resize(jobs_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    for j in jobs:
        with open(j["src"], "rb") as f:
            raw = np.frombuffer(f.read(), np.uint8).reshape(j["height"], j["width"], 3)
        img = Image.fromarray(raw)
        if j["crop"] is not None:
            img = img.crop(tuple(j["crop"]))
        out = img.resize(tuple(j["size"]), Image.BILINEAR, box=tuple(j["box"]))
        with open(j["out"], "wb") as f:
            f.write(out.tobytes())


if __name__ == "__main__":
    {"make": make, "crops": crops, "resize": resize}[sys.argv[1]](sys.argv[2])
