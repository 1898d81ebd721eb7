"""The accuracy study's plot: KL divergence against position (log scale), one line per
variant, one panel per family, drawn with Pillow (matplotlib is not a dependency)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

COLOURS = {
    "stock_bf16": (214, 39, 40),
    "replayssm_lp_bf16": (31, 119, 180),
    "replayssm_lp_fp16": (44, 160, 44),
    "replayssm_hp_only": (148, 103, 189),
}
PANEL_W, PANEL_H = 560, 380
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 20, 40, 50
FLOOR = 1e-12  # KL values below this are drawn at it (exact agreement gives 0)


def _decades(values: list[float]) -> tuple[int, int]:
    logs = [math.log10(max(v, FLOOR)) for v in values]
    return math.floor(min(logs)), math.ceil(max(logs)) if max(logs) > min(logs) else 1


def _panel(draw: ImageDraw.ImageDraw, x0: int, family: str, results: dict[str, Any]) -> None:
    font = ImageFont.load_default()
    variants = results["variants"]
    curves = {name: v["curve"]["kl_mean"] for name, v in variants.items()}
    step = next(iter(variants.values()))["curve"]["bin"]
    n_points = max(len(c) for c in curves.values())
    lo, hi = _decades([v for c in curves.values() for v in c])
    hi = max(hi, lo + 1) + 1  # a decade of headroom for the legend
    left, top = x0 + MARGIN_L, MARGIN_T
    width, height = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B

    def xy(i: int, value: float) -> tuple[float, float]:
        x = left + width * (i + 0.5) / n_points
        y = top + height * (hi - math.log10(max(value, FLOOR))) / (hi - lo)
        return x, y

    draw.rectangle([left, top, left + width, top + height], outline=(0, 0, 0))
    for d in range(lo, hi + 1):
        y = top + height * (hi - d) / (hi - lo)
        draw.line([left, y, left + width, y], fill=(225, 225, 225))
        draw.text((left - 45, y - 6), f"1e{d}", fill=(0, 0, 0), font=font)
    positions = n_points * step
    for k in range(5):
        x = left + width * k / 4
        draw.text(
            (x - 12, top + height + 6), str(round(positions * k / 4)), fill=(0, 0, 0), font=font
        )
    draw.text((left + width / 2 - 60, top + height + 26), "generated position", fill=(0, 0, 0))
    draw.text((left, 12), f"{family}: KL(stock fp32 || variant), nats/token", fill=(0, 0, 0))
    for name, curve in curves.items():
        draw.line(
            [xy(i, v) for i, v in enumerate(curve)], fill=COLOURS.get(name, (0, 0, 0)), width=2
        )
    box = [left + 4, top + 4, left + 190, top + 10 + 14 * len(curves)]
    draw.rectangle(box, fill=(255, 255, 255), outline=(160, 160, 160))
    for row, name in enumerate(curves):
        colour = COLOURS.get(name, (0, 0, 0))
        ly = top + 8 + 14 * row
        draw.line([left + 8, ly + 6, left + 28, ly + 6], fill=colour, width=2)
        draw.text((left + 32, ly), name, fill=(0, 0, 0), font=font)


def plot_kl(payload: dict[str, Any], path: Path) -> Path:
    """Write the study's plot to `path` (PNG)."""
    families = payload["families"]
    image = Image.new("RGB", (PANEL_W * len(families), PANEL_H), "white")
    draw = ImageDraw.Draw(image)
    for i, (family, results) in enumerate(families.items()):
        _panel(draw, i * PANEL_W, family, results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
    return path
