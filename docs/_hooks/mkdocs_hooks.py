"""MkDocs hooks of the documentation site (``mkdocs.yml`` lists this file).

The build fails, before any page is rendered, when a public name that the API
reference renders has no docstring: the reference is generated from the docstrings,
so a missing one would be a silent hole in it. What counts as public, and which
wrapper methods take their text from ``BaseCheckpointStore``, is defined in
``griffe_statekeeper.py`` beside this file.

The guides in ``docs/`` are also read on a code host, where a link such as
``[CONTRIBUTING.md](../CONTRIBUTING.md)`` works. The site has no page for a file
outside ``docs/``, so such a link to a file that exists in the repository becomes its
path in code (``CONTRIBUTING.md``, in the repository); a link to a file that does not
exist is left alone, and the strict build fails on it.

A code block whose first line is ``# doctest: skip`` is shown but not run by
``tests/test_docs.py``. The marker is for that test, not for readers: the site shows
the block without it.

A console block marked ``{.sk-commands}`` (the home page's "Two commands") wraps its
long lines at spaces (``docs/stylesheets/extra.css``); each word of it is kept whole,
so that a reader who retypes ``--frozen`` does not see it split after ``--``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

sys.path.insert(0, str(Path(__file__).parent))

from griffe_statekeeper import load_statekeeper, missing_docstrings


def on_config(config: Any, **kwargs: Any) -> Any:
    root = Path(config["config_file_path"]).parent
    missing = missing_docstrings(load_statekeeper(str(root / "src")))
    if missing:
        raise PluginError(
            "public names without a docstring (the API reference is generated from "
            "them):\n  " + "\n  ".join(missing)
        )
    return config


_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
# the opening line of a fenced block, then the marker as the block's first line
_DOCTEST_MARKER = re.compile(r"\A((?:```|~~~)[^\n]*\n)# doctest: skip[ \t]*\n")


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    here = Path(page.file.abs_src_path).parent

    def outside(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        path = (here / target).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
            return match.group(0)  # a page of the site, or truly broken: mkdocs judges
        shown = path.relative_to(root).as_posix()
        if text.strip("`") in (shown, path.name):
            return f"`{shown}`"
        return f"{text} (`{shown}` in the repository)"

    # code blocks are shown as written, without the marker meant for tests/test_docs.py
    parts, last = [], 0
    for fence in _FENCE.finditer(markdown):
        block = _DOCTEST_MARKER.sub(r"\1", fence.group(0), count=1)
        parts += [_LINK.sub(outside, markdown[last : fence.start()]), block]
        last = fence.end()
    parts.append(_LINK.sub(outside, markdown[last:]))
    return "".join(parts)


_COMMANDS = re.compile(r'(<div class="[^"]*\bsk-commands\b[^"]*">.*?</code>)', re.S)
_TEXT = re.compile(r">([^<]+)<")
_WORD = re.compile(r"[^\s]+")


def on_page_content(html: str, page: Any, config: Any, **kwargs: Any) -> str:
    def words(text: re.Match[str]) -> str:
        kept = _WORD.sub(lambda w: f'<span class="sk-word">{w.group(0)}</span>', text.group(1))
        return f">{kept}<"

    return _COMMANDS.sub(lambda block: _TEXT.sub(words, block.group(1)), html)
