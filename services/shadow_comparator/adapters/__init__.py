"""The comparator's I/O: its Redis store."""
