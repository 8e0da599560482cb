"""`python -m shardline.api.cli`: the same command line as `shardline`."""

from shardline.api.cli.app import main

main()
