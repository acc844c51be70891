"""Shared figure style: one colour per method across every figure of every study."""

from __future__ import annotations

import colorsys
import hashlib
import re

from matplotlib.colors import to_hex, to_rgb

# Methods that share a figure get clearly different colours; a method keeps its colour in every
# study (FedAvg is always blue) and each paper's own method is a shade of red.
KNOWN_COLORS: dict[str, str] = {
    # FedDisco baselines
    "FedAvg": "#1f77b4",
    "FedAvgM": "#17becf",
    "FedProx": "#ff7f0e",
    "SCAFFOLD": "#2ca02c",
    "FedDyn": "#9467bd",
    "FedNova": "#8c564b",
    "MOON": "#e377c2",
    "FedDC": "#bcbd22",
    "FedDisco": "#d62728",
    # FedL2G (heterogeneous models)
    "LG-FedAvg": "#1b9e77",
    "FedGH": "#e6ab02",
    "FML": "#7570b3",
    "FedKD": "#e7298a",
    "FedDistill": "#66a61e",
    "FedProto": "#a6761d",
    "FedL2G-l": "#b2182b",
    "FedL2G-f": "#fb6a4a",
    # FedGTST (transferability)
    "FedSR": "#f28e2b",
    "FedIIR": "#b07aa1",
    "FedGTST": "#e15759",
    # Feddle (asynchronous)
    "Center": "#333333",
    "Fed+FT": "#76b7b2",
    "HFCL": "#9c755f",
    "FedDF": "#59a14f",
    "FedAsync": "#ff9da7",
    "FedBuff": "#8c6bb1",
    "CA2FL": "#e08214",
    "Feddle-ID": "#cb181d",
    "Feddle-OOD": "#7a0177",
}

# Spellings the papers print for the same method (see paper_tables/README.md).
_ALIASES = {"oursid": "Feddle-ID", "oursood": "Feddle-OOD"}

FIGURE_RC: dict[str, object] = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 12,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.6,
    "pdf.fonttype": 42,  # embed TrueType so PDFs stay editable and journal-safe
    "svg.fonttype": "none",
}

_DISCO = re.compile(r"\s*\+\s*disco\s*$", re.IGNORECASE)


def _norm(label: str) -> str:
    return re.sub(r"[\s_\-]", "", label).lower()


_BY_NORM = {_norm(k): v for k, v in KNOWN_COLORS.items()} | {k: KNOWN_COLORS[v] for k, v in _ALIASES.items()}


def is_disco_variant(label: str) -> bool:
    """True for labels like "FedProx+Disco" / "FedProx + Disco" (a baseline with Disco weights)."""
    return bool(_DISCO.search(label))


def base_label(label: str) -> str:
    """Label without a trailing "+ Disco"."""
    return _DISCO.sub("", label)


def _fallback(label: str) -> str:
    # md5, not hash(): Python salts str hashes per process, and colours must survive reruns.
    h = int(hashlib.md5(_norm(label).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return to_hex(colorsys.hls_to_rgb(h, 0.45, 0.65))


def _darken(color: str, amount: float = 0.35) -> str:
    return to_hex(tuple(c * (1.0 - amount) for c in to_rgb(color)))


def method_color(label: str) -> str:
    """Stable hex colour of one method label (case, spaces and hyphens ignored)."""
    if is_disco_variant(label):
        return _darken(method_color(base_label(label)))
    return _BY_NORM.get(_norm(label)) or _fallback(label)


def method_palette(labels: list[str]) -> dict[str, str]:
    """Colour per method label, identical in every figure; "+Disco" variants get a darker base hue."""
    return {label: method_color(label) for label in labels}


def method_dashes(labels: list[str]) -> dict[str, str | tuple[float, float]]:
    """Seaborn ``dashes`` mapping: "+Disco" variants dashed, everything else solid."""
    return {label: (4.0, 2.0) if is_disco_variant(label) else "" for label in labels}
