"""`python -m loadtest.scenarios`: the load scenarios' command line (`loadtest.scenarios.cli`)."""

from loadtest.scenarios.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
