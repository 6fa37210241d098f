"""Scripts that measure the product end to end; each prints figures and asserts nothing."""
