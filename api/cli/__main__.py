"""`python -m api.cli`: the same command line as `shardline`."""

from api.cli.app import main

main()
