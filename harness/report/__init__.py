"""8. The report: REPORT.md and its figures, and the terminal's tables, from records alone."""
