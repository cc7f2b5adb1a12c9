"""`python -m taxes ...`: the same command line as `taxes ...`."""

from taxes.cli.main import cli

if __name__ == "__main__":
    cli.main(prog_name="taxes")
