"""Finance's cost reports: the report, its HTML page, the quality beside the savings, the CLI."""
