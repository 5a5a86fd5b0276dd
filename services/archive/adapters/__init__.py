"""The archive's I/O: its Parquet store."""
