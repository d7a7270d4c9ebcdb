"""``gpuwarden web``: the daemon's web page for you, on a local address."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--listen",
    default="127.0.0.1:9404",
    show_default=True,
    help="HOST:PORT to serve the page on (keep it local: it shows your view).",
)
def web(listen: str) -> None:
    """Serve the daemon's web page (GPU memory over time, the queue, each job) at
    http://LISTEN/ui/, read through the daemon's unix socket as you, to you alone: open
    the URL it prints (it holds a random token, which your browser then keeps in a
    cookie). Ctrl-C stops it."""
    import asyncio
    import secrets

    from gpuwarden.cli.daemon import connect
    from gpuwarden.metrics.exporter import parse_listen
    from gpuwarden.web.proxy import serve

    host, port = parse_listen(listen)
    client = connect()  # one clear line and exit 3 when no daemon runs
    token = secrets.token_urlsafe(32)

    def ready() -> None:
        click.echo(
            f"gpuwarden web: http://{listen}/ui/?token={token} (the daemon at "
            f"{client.socket_path}; Ctrl-C to stop)",
            err=True,
        )

    try:
        asyncio.run(serve(client.socket_path, host, port, token, ready))
    except OSError as e:
        raise click.ClickException(f"cannot listen on {listen}: {e.strerror or e}") from None
    except KeyboardInterrupt:
        pass
