"""`python -m loadtest.load`: the load generator's command line (`loadtest.load.generator`)."""

from loadtest.load.generator import main

if __name__ == "__main__":
    raise SystemExit(main())
