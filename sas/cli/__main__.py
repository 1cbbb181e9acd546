"""`python -m sas.cli ...` runs the `sas` command line."""

from sas.cli.main import main

main()
