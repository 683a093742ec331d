"""`completion`: the bash or zsh completion script."""

from __future__ import annotations

import click

from ctfleet.cli.base import CONTEXT, cli


@cli.command(context_settings=CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh"]))
def completion(shell: str) -> None:
    """Print the shell completion script.

    \b
    Examples:
      ctfleet completion bash > ~/.local/share/bash-completion/completions/ctfleet
      echo 'eval "$(ctfleet completion zsh)"' >> ~/.zshrc
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "ctfleet", "_CTFLEET_COMPLETE").source())
