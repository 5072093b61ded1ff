"""Argument parsing shared by the entry points (``marl.train``, ``marl.evaluate``,
``marl.export``): flags are spelled in full, and a misspelt one is answered with the closest
known flag.

``python -m marl.train --total-step 5`` -> ``error: unrecognized option '--total-step'; did
you mean --total-steps? ...`` (exit status 2), where argparse's default would have taken the
prefix as ``--total-steps``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["StrictArgumentParser", "closest_flag", "option_strings", "unrecognized_message"]


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag of ``parser`` (``--total-steps``, ``--total_steps``, ...)."""
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def closest_flag(token: str, flags: Iterable[str]) -> str | None:
    """The known flag closest to ``token`` (``--flag`` or ``--flag=value``) by
    :func:`difflib.get_close_matches`, or None when none is close or ``token`` is no flag.
    ``_`` and ``-`` count as the same letter; of two such spellings the dashed one is named."""
    name = token.split("=", 1)[0]
    if not name.startswith("--"):
        return None
    by_spelling: dict[str, str] = {}
    for flag in sorted(flags, key=lambda f: "_" in f):  # dashed spellings first
        by_spelling.setdefault(flag.replace("_", "-"), flag)
    close = difflib.get_close_matches(name.replace("_", "-"), list(by_spelling), n=1)
    return by_spelling[close[0]] if close else None


def unrecognized_message(extra: Sequence[str], flags: Iterable[str]) -> str:
    """``unrecognized arguments: A B; did you mean --xyz?`` for the arguments no option
    took (the suggestion for the first unknown flag that has a close match)."""
    flags = list(flags)
    message = f"unrecognized arguments: {' '.join(extra)}"
    for token in extra:
        match = closest_flag(token, flags)
        if match is not None:
            return f"{message}; did you mean {match}?"
    return message


class StrictArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` that takes flags spelled in full only
    (``allow_abbrev=False``: ``--episode`` is not ``--episodes``) and names the closest known
    flag for an unknown one (:func:`unrecognized_message`; exit status 2, as argparse).

    Unknown flags are reported before anything else, so that ``--ou x`` says "did you mean
    --out?" rather than "the following arguments are required: --out"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        args = sys.argv[1:] if args is None else list(args)
        flags = option_strings(self)
        for token in args:
            if token == "--":  # what follows is positional
                break
            # a flag as argparse sees one: "--name" or "--name=value", no space in it
            if token.startswith("--") and " " not in token and token.split("=")[0] not in flags:
                self.error(unrecognized_message([token], flags))
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(unrecognized_message(extra, flags))
        return ns
