"""Image bytes from an archive member -> a uint8 array: the one decoder every data set preparation uses."""

from __future__ import annotations

import io

import numpy as np


def decode_image(data: bytes, where: str, side: int | None = None, *, grey: bool = False,
                 resample: str = "bilinear", draft: bool = False, center_crop: bool = False) -> np.ndarray:
    """``data`` as uint8 [H, W, 3] RGB (or [H, W] with ``grey``): optionally the centred square crop
    (``center_crop``), resized to side x side (``resample``: "bilinear", as torchvision's Resize, or
    "lanczos"); ``draft`` lets a JPEG decode at a reduced scale (>= 2x the target) first. Unreadable bytes
    raise ValueError naming ``where``."""
    from PIL import Image  # lazy: importing PIL costs time that light rules should not pay

    mode = "L" if grey else "RGB"
    try:
        with Image.open(io.BytesIO(data)) as img:
            if draft and side is not None:
                img.draft(mode, (2 * side, 2 * side))
            img = img.convert(mode)
            if center_crop:
                w, h = img.size
                s = min(w, h)
                img = img.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
            if side is not None and img.size != (side, side):
                method = {"bilinear": Image.Resampling.BILINEAR, "lanczos": Image.Resampling.LANCZOS}[resample]
                img = img.resize((side, side), method)
            return np.asarray(img, dtype=np.uint8)
    except Exception as e:  # PIL raises several types for broken images (OSError, SyntaxError, ...)
        raise ValueError(f"{where}: not a readable image ({e})") from e
