"""One comparison: inputs for each task, baseline against assisted generation, the speed probes around them."""
