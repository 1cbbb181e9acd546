"""`python -m sas ...` runs the `sas` command line (as `python -m sas.cli ...` does)."""

from sas.cli.main import main

main()
