"""mindrl.workers."""
