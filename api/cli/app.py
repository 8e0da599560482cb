"""The `shardline` command line."""

from __future__ import annotations

import logging
import os
import sys

import typer

from shardline.api.cli import (
    calibrating,
    demo,
    hf,
    jobs,
    login,
    migrate,
    pausing,
    plan,
    profiling,
    serve,
    train,
    watching,
)
from shardline.api.cli.tokens import tokens_app

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Shardline: train large language models on your own cluster.",
)
app.command()(train.train)
app.command()(plan.plan)
app.command()(calibrating.calibrate)
app.command()(serve.serve)
app.command()(migrate.migrate)
app.command()(demo.demo)
app.command()(login.login)
app.command()(login.logout)
app.command()(jobs.submit)
app.command()(watching.follow)
app.command()(watching.wait)
app.command()(jobs.jobs)
app.command()(jobs.status)
app.command()(jobs.cancel)
app.command()(jobs.delete)
app.command()(jobs.logs)
app.command()(jobs.metrics)
app.command()(pausing.pause)
app.command()(pausing.resume)
# A negative priority is a value, not an unknown option.
app.command(context_settings={"ignore_unknown_options": True})(pausing.priority)
app.command()(pausing.checkpoints)
app.command()(profiling.profile)
app.command()(hf.export)
app.command()(hf.generate)
app.add_typer(tokens_app, name="token")


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("SHARDLINE_LOG_LEVEL", "WARNING"),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    app()


if __name__ == "__main__":
    main()
