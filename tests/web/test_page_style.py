"""
The pages' style sheet against WCAG 2.2 AA contrast (1.4.3): small print
stays readable in the light and the dark colour scheme the pages allow.
"""

from __future__ import annotations

import re

import pytest

from authsrv.web.pages import STYLE

SCHEMES = {"light": ((0, 0, 0), (255, 255, 255)), "dark": ((255, 255, 255), (18, 18, 18))}
"""Each scheme's text and background: CanvasText on Canvas, as Chromium draws them."""


def luminance(rgb: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def small_print(text: tuple[int, ...], background: tuple[int, ...]) -> tuple[float, ...]:
    """The colour C{<small>} text ends up in: its own colour or the page's, faded by its opacity."""
    [rule] = re.findall(r"^small\{(.*)\}$", STYLE, re.M)
    declarations = dict(d.split(":", 1) for d in rule.split(";"))
    if "color" in declarations:
        digits = declarations["color"].lstrip("#")
        digits = "".join(d * 2 for d in digits) if len(digits) == 3 else digits
        text = tuple(int(digits[i:i + 2], 16) for i in (0, 2, 4))
    alpha = float(declarations.get("opacity", "1"))
    return tuple(alpha * t + (1 - alpha) * b for t, b in zip(text, background))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_small_print_has_aa_contrast(scheme):
    text, background = SCHEMES[scheme]
    assert contrast(small_print(text, background), background) >= 4.5
