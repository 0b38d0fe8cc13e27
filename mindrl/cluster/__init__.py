"""mindrl.cluster."""
