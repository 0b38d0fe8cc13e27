"""Developer tools: plotting, benchmarks, test assets. Importable (`tools.plot_metrics`,
`tools.bench.e2e`) for the tests; each module also runs as a script."""
