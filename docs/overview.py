"""The README's picture of what runs where: this file is its source.

    python docs/overview.py --out docs/overview.svg    # after an edit here
    python docs/overview.py --check                    # the committed SVG is current

It draws, from the lists below, one machine with a master bus, programs on
it and a relay per container, a second machine, the NATS cluster that joins
their masters, the traffic pipeline on Spark and the metrics.  Plain SVG
written by hand, byte for byte the same on every machine (no layout engine
whose version would change it); tests/firstrun/test_overview.py keeps the
committed file equal to this script's output.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "overview.svg"
WIDTH, HEIGHT = 1000, 520
TITLE = "One bus per machine; a relay per container; machines joined by NATS"
FONT = "font-family='Helvetica, Arial, sans-serif'"
#: fill, stroke and text colours of each kind of box
STYLES = {
    "host": ("#f6f8fa", "#57606a", "#24292f"),
    "container": ("#ffffff", "#8c959f", "#24292f"),
    "bus": ("#ddf4ff", "#0969da", "#0a3069"),
    "relay": ("#dafbe1", "#1a7f37", "#0f5323"),
    "app": ("#ffffff", "#8c959f", "#24292f"),
    "nats": ("#fff8c5", "#9a6700", "#4d2d00"),
    "spark": ("#fbefff", "#8250df", "#3e1f79"),
    "metrics": ("#ffebe9", "#cf222e", "#67060c"),
}


@dataclass(frozen=True)
class Box:
    """A rectangle with a title (bold) and up to two lines under it; a host or a
    container has its title in its top left corner instead."""

    kind: str
    x: int
    y: int
    w: int
    h: int
    title: str
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Arrow:
    """A line from (x1, y1) to (x2, y2): ``sbus`` (a Unix socket) or ``nats``
    (TCP), with a label beside its middle."""

    x1: int
    y1: int
    x2: int
    y2: int
    kind: str = "sbus"
    label: str = ""
    both: bool = True


def _container(x: int, y: int, w: int, title: str, apps: tuple[str, str]) -> list[Box]:
    inner = w - 30
    half = (inner - 10) // 2
    return [
        Box("container", x, y, w, 130, title),
        Box("relay", x + 15, y + 26, inner, 46, "relay", ("its own bus in the container",)),
        Box("app", x + 15, y + 84, half, 32, apps[0]),
        Box("app", x + 25 + half, y + 84, half, 32, apps[1]),
    ]


BOXES: list[Box] = [
    Box("host", 20, 40, 480, 460, "machine A"),
    Box("app", 40, 80, 140, 64, "programs", ("pub, sub, your code",)),
    Box("bus", 210, 72, 200, 80, "master bus", ("sbus-relay serve, or sbusd", "/run/sbus.socket")),
    *_container(40, 200, 215, "container 1", ("web app", "worker")),
    *_container(270, 200, 215, "container 2", ("sensor", "logger")),
    Box(
        "spark",
        40,
        370,
        445,
        110,
        "traffic pipeline (PySpark)",
        ("record: a client writing Parquet files;", "analyze: a report with charts, on Spark"),
    ),
    Box("nats", 530, 70, 120, 86, "NATS cluster", ("(nats-server)",)),
    Box("host", 680, 40, 300, 300, "machine B"),
    Box("bus", 730, 72, 200, 80, "master bus", ("its own, on machine B",)),
    *_container(700, 190, 260, "container", ("app", "app")),
    Box(
        "metrics",
        680,
        370,
        300,
        110,
        "metrics",
        ("every bus serves /metrics and /clients:", "Prometheus, Grafana, sbus-relay top"),
    ),
]
ARROWS: list[Arrow] = [
    Arrow(180, 112, 210, 112),
    Arrow(147, 226, 232, 152, label="upstream"),
    Arrow(377, 226, 340, 152),
    Arrow(410, 112, 530, 112, kind="nats"),
    Arrow(650, 112, 730, 112, kind="nats"),
    Arrow(830, 216, 830, 152),
    Arrow(262, 370, 262, 152, both=False),  # record: a client of the master
]


def _text(x: float, y: float, text: str, size: int, colour: str, **extra: str) -> str:
    attributes = "".join(f" {k.replace('_', '-')}='{v}'" for k, v in extra.items())
    return (
        f"<text x='{x:g}' y='{y:g}' {FONT} font-size='{size}' fill='{colour}'{attributes}>"
        f"{escape(text)}</text>"
    )


def _box(box: Box) -> list[str]:
    fill, stroke, ink = STYLES[box.kind]
    framed = box.kind in ("host", "container")
    dash = " stroke-dasharray='6 4'" if box.kind == "container" else ""
    out = [
        f"<rect x='{box.x}' y='{box.y}' width='{box.w}' height='{box.h}' rx='8' fill='{fill}'"
        f" stroke='{stroke}' stroke-width='1.5'{dash}/>"
    ]
    if framed:
        out.append(_text(box.x + 10, box.y + 18, box.title, 13, ink, font_weight="bold"))
        return out
    middle = box.x + box.w / 2
    first = box.y + box.h / 2 - 8 * len(box.lines) + 5
    out.append(_text(middle, first, box.title, 14, ink, font_weight="bold", text_anchor="middle"))
    for i, line in enumerate(box.lines):
        out.append(_text(middle, first + 17 * (i + 1), line, 12, ink, text_anchor="middle"))
    return out


def _arrow(arrow: Arrow) -> list[str]:
    colour = "#9a6700" if arrow.kind == "nats" else "#0969da"
    width = "3" if arrow.kind == "nats" else "1.8"
    heads = " marker-end='url(#head)'"
    if arrow.both:
        heads += " marker-start='url(#tail)'"
    dash = " stroke-dasharray='7 4'" if arrow.kind == "nats" else ""
    out = [
        f"<line x1='{arrow.x1}' y1='{arrow.y1}' x2='{arrow.x2}' y2='{arrow.y2}'"
        f" stroke='{colour}' stroke-width='{width}'{dash}{heads}/>"
    ]
    if arrow.label:
        x = (arrow.x1 + arrow.x2) / 2 + 6
        y = (arrow.y1 + arrow.y2) / 2 + 4
        out.append(_text(x, y, arrow.label, 11, "#57606a", font_style="italic"))
    return out


def render() -> str:
    """The SVG, as text."""
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}'"
        f" viewBox='0 0 {WIDTH} {HEIGHT}'>",
        "<title>sbus_relay: a master bus per machine, a relay per container, machines"
        " joined by NATS, traffic analysed on Spark</title>",
        "<defs>"
        "<marker id='head' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7'"
        " markerHeight='7' orient='auto'><path d='M0,0 L10,5 L0,10 z' fill='#57606a'/></marker>"
        "<marker id='tail' viewBox='0 0 10 10' refX='1' refY='5' markerWidth='7'"
        " markerHeight='7' orient='auto'><path d='M10,0 L0,5 L10,10 z' fill='#57606a'/></marker>"
        "</defs>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='#ffffff'/>",
        _text(20, 24, TITLE, 15, "#24292f", font_weight="bold"),
    ]
    for box in BOXES:
        out += _box(box)
    for arrow in ARROWS:
        out += _arrow(arrow)
    out.append(_text(530, 180, "sbus: Unix socket", 11, "#0969da"))
    out.append(_text(530, 196, "NATS: TCP", 11, "#9a6700"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw docs/overview.svg.")
    parser.add_argument("--out", type=Path, help="write the SVG here (default: stdout)")
    parser.add_argument(
        "--check", nargs="?", const=OUT, type=Path, metavar="FILE",
        help="exit 1 if FILE (default: the committed SVG) is not this script's output",
    )  # fmt: skip
    args = parser.parse_args(argv)
    text = render()
    if args.check is not None:
        if args.check.read_text() != text:
            print(f"{args.check} is not current: python docs/overview.py --out {args.check}")
            return 1
        return 0
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
