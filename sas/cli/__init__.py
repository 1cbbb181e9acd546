"""The `sas` command line: `inspect`, `plot` and `compile` a pattern script (`sas --help`).

The commands live in `sas.cli.main` (entry point `main`), the figures in `sas.cli.plotting`.
Nothing is imported here so that `python -m sas.cli.main` runs without a double import.
"""
