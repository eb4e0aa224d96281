"""The memory page as one self-contained HTML file.

:func:`render` turns page data (:func:`memopt.pages.model.page`) into HTML:
the data as JSON in a ``<script type="application/json">`` element, the
style sheet and the script of :mod:`memopt.pages.assets` inlined.  The file
loads nothing else: it opens offline, from disk, in any current browser.
"""
from __future__ import annotations

import html
import json

from .assets import CSS, JS

__all__ = ["render", "write"]


def _json_for_script(data: dict) -> str:
    """``data`` as JSON that cannot end its ``<script>`` element early."""
    text = json.dumps(data, separators=(",", ":"), sort_keys=False, ensure_ascii=True)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render(data: dict) -> str:
    """The page's HTML text (deterministic: same data, same text)."""
    title = html.escape(str(data.get("title", "memory")))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title>"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<style>{CSS}</style></head>\n<body><div id=\"memopt-page\"></div>\n"
        "<noscript>This page draws its charts with JavaScript.</noscript>\n"
        f"<script id=\"memopt-data\" type=\"application/json\">{_json_for_script(data)}</script>\n"
        f"<script>{JS}</script>\n</body></html>\n")


def write(data: dict, path: str) -> str:
    """Write :func:`render` of ``data`` to ``path`` (UTF-8); returns ``path``."""
    from ..errors import ModelFileError

    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(render(data))
    except OSError as exc:
        raise ModelFileError(f"cannot write the memory page {path}: "
                             f"{exc.strerror or exc}") from None
    return path
