"""Models: the catalog as validated data, the offline packs and their cache, conversion, loading, the memory-bounded pool."""
