"""Names every layer shares: the files of an evidence bundle."""

RESULTS = "results.json"  # the bundle's machine-readable record (schemas/results.schema.json)
README = "README.md"  # the bundle's human-readable page, rendered from results.json alone
CHART = "chart.png"  # the bundle's chart (the chart extra)
