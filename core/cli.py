"""Command-line help as the scripts print it: every option one line of help followed by its
default (scripts/serve, scripts/replay, scripts/bench NAME and the processes they start)."""
from __future__ import annotations

import argparse


class Help(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already says it, or the
    default says nothing (None, a flag's False/True, suppressed)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default" in text or not action.option_strings
                or default is None or isinstance(default, bool) or default == argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def parser(prog: str | None = None, description: str | None = None,
           **kw) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=Help, **kw)


def command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand of `sub` (add_subparsers), its help both in the list and its own --help."""
    return sub.add_parser(name, help=help, description=help, formatter_class=Help)
